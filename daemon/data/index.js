// speakd's page: speak through the HTTP API (docs/http.md) and watch the daemon. Plain
// JavaScript, no build step; every value from the daemon goes into the page as text.
"use strict";

const $ = (id) => document.getElementById(id);
const TOKEN_KEY = "speakd-token";
let options = [];
let voices = new Map();
let notes = 0;

function headers(json) {
  const h = json ? { "Content-Type": "application/json" } : {};
  const token = $("token").value.trim();
  if (token) h.Authorization = "Bearer " + token;
  return h;
}

// Every URL is relative: the page works under a path prefix (Home Assistant's ingress).
async function api(path, body, method) {
  const init = body === undefined ? { headers: headers(false) }
    : body === null ? { method, headers: headers(false) }
      : { method: method || "POST", headers: headers(true), body: JSON.stringify(body) };
  const response = await fetch(path, init);
  if (!response.ok) {
    let message = response.status + " " + response.statusText;
    try {
      const error = (await response.json()).error;
      message = error.code + ": " + error.message;
    } catch (e) { /* not JSON */ }
    throw new Error(message);
  }
  return response;
}

function note(text, isError) {
  const li = document.createElement("li");
  const number = document.createElement("span");
  number.className = "n";
  number.textContent = String(++notes);
  li.append(number, new Date().toLocaleTimeString() + " " + text);
  if (isError) li.className = "error";
  $("log").prepend(li);
}

function fill(dl, rows) {
  dl.replaceChildren();
  for (const [key, value] of rows) {
    const dt = document.createElement("dt");
    const dd = document.createElement("dd");
    dt.textContent = key;
    dd.textContent = value === null || value === undefined ? "–" : String(value);
    dl.append(dt, dd);
  }
}

function option(select, value, label, selected) {
  const o = document.createElement("option");
  o.value = value;
  o.textContent = label;
  o.selected = selected;
  select.append(o);
}

async function loadVoices() {
  const info = await (await api("v1/audio/voices")).json();
  voices = new Map(info.voices.map((v) => [v.id, v]));
  const voice = $("voice");
  voice.replaceChildren();
  for (const v of info.voices) {
    const langs = (v.languages || []).join(", ");
    option(voice, v.id, `${v.id} (${v.engine}; ${langs}; ${v.licence})`, v.id === info.default);
  }
  const format = $("format");
  format.replaceChildren();
  for (const f of info.formats) option(format, f, f, f === "wav");
  showVoice();
  document.body.dataset.voices = String(info.voices.length);
  // the built-in chimes and the pinned clips a request may play first (speakd's chime field)
  const chimes = (await (await api("v1/status")).json()).chimes;
  const chime = $("chime");
  chime.replaceChildren();
  option(chime, "", "none", true);
  for (const c of chimes) option(chime, c, c, false);
}

// The chosen voice's speakers (a multi-speaker Piper voice, ChatTTS's embeddings) and options.
function showVoice() {
  const v = voices.get($("voice").value) || { speakers: [], options: [] };
  const speaker = $("speaker");
  speaker.replaceChildren();
  for (const s of v.speakers) option(speaker, s, s, false);
  speaker.parentElement.hidden = v.speakers.length === 0;
  options = v.options;
  const box = $("options");
  box.replaceChildren();
  for (const o of options) {
    const label = document.createElement("label");
    label.title = o.help;
    const input = document.createElement("input");
    input.id = "opt-" + o.name;
    if (o.type === "bool") {
      input.type = "checkbox";
    } else {
      input.type = "number";
      input.step = o.type === "int" ? "1" : "0.05";
      if (o.min !== undefined) { input.min = o.min; input.max = o.max; }
      input.placeholder = o.default === undefined ? "default" : String(o.default);
    }
    label.append(o.name + " ", input);
    box.append(label);
  }
}

function params() {
  const out = {};
  for (const o of options) {
    const input = $("opt-" + o.name);
    if (o.type === "bool") {
      if (input.checked) out[o.name] = true;
    } else if (input.value !== "") {
      out[o.name] = Number(input.value);
    }
  }
  return out;
}

function request() {
  return {
    text: $("text").value,
    voice: $("voice").value || null,
    speaker: $("speaker").parentElement.hidden ? null : $("speaker").value,
    speed: Number($("speed").value) || 1,
    params: params(),
    chime: $("chime").value || null,
  };
}

// OpenAI's pcm has no header: a browser plays it once it is wrapped as a WAV (16-bit mono).
function wavOf(pcm, rate) {
  const head = new DataView(new ArrayBuffer(44));
  const tag = (at, text) => [...text].forEach((c, i) => head.setUint8(at + i, c.charCodeAt(0)));
  tag(0, "RIFF");
  head.setUint32(4, 36 + pcm.byteLength, true);
  tag(8, "WAVE");
  tag(12, "fmt ");
  head.setUint32(16, 16, true);
  head.setUint16(20, 1, true); // PCM
  head.setUint16(22, 1, true); // mono
  head.setUint32(24, rate, true);
  head.setUint32(28, rate * 2, true);
  head.setUint16(32, 2, true);
  head.setUint16(34, 16, true);
  tag(36, "data");
  head.setUint32(40, pcm.byteLength, true);
  return new Blob([head, pcm], { type: "audio/wav" });
}

async function play() {
  const r = request();
  const response = await api("v1/audio/speech", {
    model: "speakd", input: r.text, voice: r.voice, speaker: r.speaker, speed: r.speed,
    params: r.params, chime: r.chime,
    response_format: $("format").value,
  });
  let blob = await response.blob();
  const rate = response.headers.get("X-Sample-Rate");
  if (response.headers.get("Content-Type") === "audio/pcm" && rate) {
    blob = wavOf(await blob.arrayBuffer(), Number(rate));
  }
  const audio = $("audio");
  if (audio.src) URL.revokeObjectURL(audio.src);
  audio.src = URL.createObjectURL(blob);
  note("playing " + Math.round(blob.size / 1024) + " kB (cache " +
    response.headers.get("X-Speakd-Cache") + ", " + response.headers.get("X-Request-Id") + ")");
  document.body.dataset.played = response.headers.get("X-Request-Id");
  await audio.play();
}

async function say() {
  const r = request();
  note("saying on the board…");
  const reply = await (await api("v1/say", {
    ...r, priority: $("priority").value, wait: true,
  })).json();
  note(reply.id + " " + reply.event + ": " + (reply.status || ""));
  document.body.dataset.said = reply.id + " " + reply.status;
}

async function stop() {
  const reply = await (await api("v1/stop", {})).json();
  note("stopped " + reply.stopped);
}

function megabytes(n) {
  return n === undefined ? "–" : (n / 1048576).toFixed(1) + " MB";
}

async function refresh() {
  try {
    const health = await fetch("healthz");
    const h = await health.json();
    $("health").textContent = h.status === "ok" ? "● ok" : "● " + h.reasons.join("; ");
    $("health").className = h.status === "ok" ? "ok" : "bad";
    const s = await (await api("v1/status")).json();
    $("engine").textContent = s.engine.kind + " " + s.engine.bundle + " (" + s.engine.precision +
      ", " + s.engine.sample_rate + " Hz)";
    const said = s.counters.accepted;
    const streamed = s.streams.streams;
    fill($("status"), [
      ["state", s.state + (s.current ? " " + s.current : "")],
      ["queue", s.queue_length + " / " + s.max_queue],
      ["streams", s.streams.active + " / " + s.streams.max + ", " + s.streams.streams_refused +
        " refused (busy)"],
      ["breaker", s.breaker ? s.breaker.state : null],
      ["audio", s.audio.sink + (s.audio.available ? "" : " (unavailable)")],
      ["requests", (said + streamed) + ": " + said + " said, " + streamed + " streamed back"],
      ["said", s.counters.finished + " finished, " + s.counters.errors + " errors, " +
        s.counters.rejected + " refused (queue full)"],
      ["uptime", Math.round(s.uptime_s) + " s"],
    ]);
    const waiting = s.current ? [s.current + " (playing)", ...s.queue] : s.queue;
    $("queue").replaceChildren(...waiting.map((id) => {
      const li = document.createElement("li");
      li.textContent = id;
      return li;
    }));
    $("queue-count").textContent = s.queue_length + " waiting, " + s.streams.active + " streaming";
    const c = s.source.cache;
    fill($("cache"), c && c.unavailable ? [["cache", "unavailable: " + c.unavailable]] : c ? [
      ["hits", c.hits], ["misses", c.misses], ["clips", c.clips],
      ["size", megabytes(c.bytes) + " of " + megabytes(c.max_bytes)],
      ["pinned", c.pinned],
    ] : [["cache", "off"]]);
    if (c) { // the budget counts unpinned clips; pinned ones are kept beyond it
      const used = c.bytes - (c.pinned_bytes || 0);
      const share = c.max_bytes ? Math.min(1, used / c.max_bytes) : 0;
      $("budget-bar").style.width = (share * 100).toFixed(1) + "%";
      $("budget-bar").className = share > 0.9 ? "full" : "";
      $("budget-bar").parentElement.title = megabytes(used) + " of " + megabytes(c.max_bytes) +
        " budget, " + megabytes(c.pinned_bytes || 0) + " pinned beyond it";
    }
    document.body.dataset.status = s.state;
  } catch (e) {
    $("health").textContent = "● " + e.message;
    $("health").className = "bad";
  }
}

function guarded(action) {
  return async () => {
    try {
      await action();
    } catch (e) {
      note(e.message, true);
    }
    refresh();
  };
}

document.addEventListener("DOMContentLoaded", () => {
  $("token").value = localStorage.getItem(TOKEN_KEY) || "";
  $("token").addEventListener("change", () => {
    localStorage.setItem(TOKEN_KEY, $("token").value.trim());
    guarded(loadVoices)();
  });
  $("voice").addEventListener("change", showVoice);
  $("play").addEventListener("click", guarded(play));
  $("say").addEventListener("click", guarded(say));
  $("stop").addEventListener("click", guarded(stop));
  guarded(loadVoices)();
  setInterval(refresh, 1000); // the queue, live
});
