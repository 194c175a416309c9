"""MQTT says, from the broker to the queue and their outcome back: journaled before they are
acknowledged, replayed at start, kept across a clean stop (``speakd.mqtt.journal`` says why).

A say's way: decoded and validated on the loop (a refusal is answered and acknowledged at once,
never journaled); handed to the journal's writer thread; when its commit returns (a callback
handed back to the loop) it is queued and its PUBACK released, in the order the PUBLISHes came
(``Connection.hold``). A stop, or a cancel naming it, that arrives while its commit runs applies
to it too: it ends ``stopped``/``cancelled`` when the commit returns. When it ends, its outcome
is written into its row and published (kept: a broker away, or paho's queue full, delays it but
never drops it), and once the broker has acknowledged it the row is marked done. A start
publishes the outcomes the broker never acknowledged, without speaking those says again; only a
crash in the moment between a say's end and its outcome's commit speaks it again, and one
between the broker's acknowledgement and the mark reports it twice.

A clean stop (``hold``) leaves the says it cuts short in the journal, unreported: a say stopped
by the shutdown, or refused because the daemon is shutting down, is replayed whole at the next
start and reported then; one cut mid-playback is spoken again from its start.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from speakd.control import Control
from speakd.mqtt.client import Connection, Incoming
from speakd.mqtt.journal import Journal, digest
from speakd.mqtt.messages import (
    Reply,
    SayFinished,
    TtsError,
    decode_object,
    optional_str,
    say_fields,
)
from speakd.mqtt.topics import parse_command_topic
from speakd.request.messages import Event, EventType, RequestError, SpeakRequest

log = logging.getLogger(__name__)

RETRYABLE = frozenset({"queue_full", "shutting_down", "journal_unavailable"})


def _hex(correlation: bytes | None) -> str | None:
    return correlation.hex() if correlation else None


@dataclass(frozen=True)
class SayOrigin:
    """What a say's outcome is reported against: Hermes ids and the MQTT 5 reply address."""

    hermes_id: str | None
    site_id: str
    session_id: str | None
    response_topic: str | None
    correlation: bytes | None


def origin_of(
    msg: Incoming, hermes_id: str | None, site_id: str, session_id: str | None
) -> SayOrigin:
    response = msg.response_topic
    if response is not None and (not response or "+" in response or "#" in response):
        log.warning("MQTT: ignoring the invalid response topic %r", response)
        response = None
    return SayOrigin(hermes_id, site_id, session_id, response, msg.correlation)


@dataclass(eq=False)
class Say:
    """One say on its way: ``seq`` once journaled; ``release`` sends its PUBACK."""

    origin: SayOrigin
    release: Callable[[], None]
    request: SpeakRequest | None = None
    seq: int | None = None
    stopped: str | None = None  # a stop or cancel that came while its commit ran


class Says:
    def __init__(
        self,
        control: Control,
        max_payload_bytes: int,
        sites: list[str],
        prefix: str,
        connection: Connection,
        journal: Journal,
        call_on_loop: Callable[..., None],
    ) -> None:
        self.control = control
        self.max_payload_bytes, self.sites, self.prefix = max_payload_bytes, sites, prefix
        self.connection = connection
        self.journal = journal
        self._call_on_loop = call_on_loop
        self._committing: list[Say] = []
        self._holding = False  # a clean stop: says cut short stay journaled (module doc)
        self._closing = False
        self._successor: Says | None = None

    # ---- in --------------------------------------------------------------------------------

    def take(self, msg: Incoming, site: str | None, release: Callable[[], None]) -> None:
        """A say on our own topic (``site``) or on Hermes' (site from the payload)."""
        try:
            obj = decode_object(msg.payload, self.max_payload_bytes)
        except RequestError as e:
            self.control.refused(f"mqtt:{msg.topic}", e.code)
            say = Say(origin_of(msg, None, site or self.sites[0], None), release)
            self._failed(say, None, e)  # unreadable: reported under our own site
            return
        site_id = site or optional_str(obj, "siteId") or "default"
        if site_id not in self.sites:
            log.debug("MQTT: say for site %r is not ours", site_id)
            release()
            return
        hermes_id, session_id = optional_str(obj, "id"), optional_str(obj, "sessionId")
        say = Say(origin_of(msg, hermes_id, site_id, session_id), release)
        identity = (msg.mid, digest(msg.topic, msg.payload))
        if msg.qos and msg.dup and self.journal.redelivery(identity):
            self._duplicate(say)
            return
        try:
            say.request = self._build(say, obj, msg.topic, site_id)
            if self.journal.full or self.control.queue_room() <= len(self._committing):
                raise RequestError("queue_full", "the queue is full; try again later")
        except RequestError as e:  # refused: answered and acknowledged, never journaled
            self._failed(say, None, e)
            return
        self._committing.append(say)
        say.seq = self.journal.add(
            msg.topic,
            msg.payload,
            msg.response_topic,
            msg.correlation,
            msg.mid if msg.qos else None,
            lambda error: self._call_on_loop(self._committed, say, error),
        )

    def _build(self, say: Say, obj: dict[str, Any], topic: str, site_id: str) -> SpeakRequest:
        return self.control.build_request(
            say_fields(obj),
            origin=f"mqtt:{topic}",
            client=f"mqtt:{site_id}",
            on_event=functools.partial(self._event, say),
        )

    def _committed(self, say: Say, error: BaseException | None) -> None:
        """Its commit returned (on the loop): queue it, then release its PUBACK."""
        self._committing.remove(say)
        assert say.request is not None and say.seq is not None
        if error is not None:  # not durable: the client hears it, then gets its PUBACK
            self.journal.forget(say.seq)
            say.seq = None
            self.control.refused(say.request.origin, "journal_unavailable")
            self._failed(say, say.request.id, RequestError("journal_unavailable", str(error)))
            return
        if say.stopped is not None:
            self._event(say, Event(EventType.FINISHED, say.request.id, {"status": say.stopped}))
        else:  # promised now: past the queue limit (its room was checked before the journal)
            self._queue(say.request, functools.partial(self.control.say, bounded=False))
        say.release()

    def _queue(self, request: SpeakRequest, submit: Callable[[SpeakRequest], None]) -> None:
        """Ids may repeat over MQTT ("Door open" twice): one still queued gets a suffix."""
        if self.control.knows(request.id):
            n = 2
            while self.control.knows(f"{request.id}~{n}"):
                n += 1
            request.id = f"{request.id}~{n}"
        submit(request)

    def replay(self) -> None:
        """Queue what the journal held at start, in its order, past every limit; publish the
        kept outcome of a say that ended (it is not spoken again)."""
        entries, self.journal.replay = self.journal.replay, []
        ended = sum(entry.outcome is not None for entry in entries)
        if len(entries) > ended:
            log.info("MQTT: replaying %d says accepted before the last exit", len(entries) - ended)
        if ended:
            log.info("MQTT: publishing the outcome of %d says the broker did not have", ended)
        for entry in entries:
            parsed = parse_command_topic(self.prefix, entry.topic)
            msg = Incoming(entry.topic, entry.payload, entry.response_topic, entry.correlation)
            say = Say(origin_of(msg, None, parsed[0] if parsed else self.sites[0], None), _noop)
            say.seq = entry.seq
            try:
                obj = decode_object(entry.payload, self.max_payload_bytes)
                site_id = (parsed[0] if parsed else None) or optional_str(obj, "siteId")
                site_id = site_id or "default"
                hermes_id, session_id = optional_str(obj, "id"), optional_str(obj, "sessionId")
                say.origin = origin_of(msg, hermes_id, site_id, session_id)
                if entry.outcome is not None:
                    self._event(say, _event_of(entry.outcome))
                    continue
                if site_id not in self.sites:
                    raise RequestError("bad_site", f"site {site_id!r} is no longer this board's")
                say.request = self._build(say, obj, entry.topic, site_id)
            except RequestError as e:  # the configuration changed under it: its outcome
                self._event(say, Event(EventType.ERROR, say.origin.hermes_id or "", {
                    "code": e.code, "message": str(e)}))  # fmt: skip
                continue
            self._queue(say.request, self.control.restore)

    def stop_committing(self, request_id: str | None = None) -> int:
        """A stop (every say) or a cancel by id reaches says whose commit is still running."""
        hit = [
            s
            for s in self._committing
            if request_id is None or (s.request is not None and s.request.id == request_id)
        ]
        for say in hit:
            say.stopped = "stopped" if request_id is None else "cancelled"
        return len(hit)

    # ---- out -------------------------------------------------------------------------------

    def _event(self, say: Say, event: Event) -> None:
        if not event.terminal or say.seq is None:  # on the way, or never journaled
            self._report(say, event)
            return
        if self._holding and _cut_by_shutdown(event):
            log.info("MQTT: say %s kept for the next start (%s)", event.request_id, _what(event))
            return
        seq, say.seq = say.seq, None
        self.journal.report(seq, _outcome_of(event))
        mark = functools.partial(self._call_on_loop, self.journal.finish, seq)
        self._report(say, event, mark)

    def _report(self, say: Say, event: Event, then: Callable[[], None] | None = None) -> None:
        """``then``: once the broker has the outcome (its last publish: PUBACKs come in order)."""
        if self._closing:  # our client is gone: the live front-end reports it
            if self._successor is not None:
                self._successor._report(say, event, then)
            elif event.terminal:  # not marked done: reported after the next start
                log.info(
                    "MQTT: outcome of say %s (%s) not published: the MQTT front-end was closed",
                    event.request_id,
                    _what(event),
                )
            return
        origin, rid = say.origin, say.origin.hermes_id or event.request_id
        if event.type == EventType.QUEUED:
            self.reply(origin, rid, "queued", {"position": event.data["position"]})
        elif event.type in (EventType.MARK, EventType.WARNING):  # a <mark>; a part skipped
            self.reply(origin, rid, event.type.value, event.data)
        elif event.type == EventType.FINISHED:
            self._finished(origin, then)
            self.reply(origin, rid, event.data["status"], then=then)
        elif event.type == EventType.ERROR:
            self._failed(say, rid, RequestError(event.data["code"], event.data["message"]), then)

    def _finished(self, origin: SayOrigin, then: Callable[[], None] | None) -> None:
        """``sayFinished``; ``then`` goes with it when no reply follows it."""
        last = then if origin.response_topic is None else None
        finished = SayFinished(origin.hermes_id, origin.site_id, origin.session_id)
        self.connection.publish(finished, on_acked=last, kept=then is not None)

    def _failed(
        self,
        say: Say,
        request_id: str | None,
        e: RequestError,
        then: Callable[[], None] | None = None,
    ) -> None:
        """A say's error on every reply path (with its sayFinished), then its PUBACK."""
        origin = say.origin
        log.info("MQTT: say %s failed: %s: %s", request_id or origin.hermes_id, e.code, e)
        self.connection.publish(
            TtsError(f"{e.code}: {e}", origin.site_id, origin.hermes_id, origin.session_id),
            kept=then is not None,
        )
        self._finished(origin, then)
        detail = {"code": e.code, "message": str(e)}
        self.reply(origin, request_id or origin.hermes_id, "error", detail, then)
        say.release()

    def _duplicate(self, say: Say) -> None:
        """A broker's redelivery of a say we hold: not spoken again, and answered on every
        path but ``sayFinished`` (the one say gets one, at its outcome)."""
        origin = say.origin
        what = "a redelivery of a say already taken; spoken once"
        log.info("MQTT: say %s is %s", origin.hermes_id or _hex(origin.correlation), what)
        self.connection.publish(
            TtsError(f"duplicate: {what}", origin.site_id, origin.hermes_id, origin.session_id)
        )
        self.reply(origin, origin.hermes_id, "duplicate")
        say.release()

    def reply(
        self,
        origin: SayOrigin,
        request_id: str | None,
        status: str,
        detail: dict[str, Any] | None = None,
        then: Callable[[], None] | None = None,
    ) -> None:
        """On the MQTT 5 response topic, when the message had one."""
        if origin.response_topic is None:
            return
        props = Properties(PacketTypes.PUBLISH)
        if origin.correlation is not None:
            props.CorrelationData = origin.correlation
        message = Reply(origin.response_topic, request_id, status, detail or {})
        self.connection.publish(message, props, on_acked=then)

    # ---- lifecycle -------------------------------------------------------------------------

    def hold(self) -> None:
        """The daemon is stopping: what is cut short now stays journaled (module doc)."""
        self._holding = True

    async def flush(self) -> None:
        """Wait for every commit queued so far and its callbacks (PUBACKs, reports)."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self.journal.barrier(lambda _e: self._call_on_loop(_resolve, done))
        await done

    def close(self, successor: Says | None) -> None:
        self._closing, self._successor = True, successor
        if successor is not None and self._holding:
            successor.hold()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _noop() -> None:
    pass


def _outcome_of(event: Event) -> str:
    """A say's final event as its journal row keeps it (``_event_of`` reads it back)."""
    data = {k: v for k, v in event.data.items() if k in ("status", "code", "message")}
    return json.dumps({"type": event.type.value, "id": event.request_id, "data": data})


def _event_of(outcome: str) -> Event:
    kept = json.loads(outcome)
    return Event(EventType(kept["type"]), kept["id"], kept["data"])


def _cut_by_shutdown(event: Event) -> bool:
    if event.type == EventType.FINISHED:
        return event.data.get("status") == "stopped"
    return event.data.get("code") == "shutting_down"


def _what(event: Event) -> str:
    return str(event.data.get("status") or event.data.get("code"))
