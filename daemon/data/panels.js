// The page's panels beyond speaking (docs/http.md, "The page"): the last minutes' requests drawn
// as time to first audio, the cached and pinned prompts (find, play, re-synthesize, pin) and
// each voice with a sample and its licence. Uses index.js's $, api and note. The plot is plain
// SVG built here: a few dozen dots need no charting library, and the page loads nothing but
// its own files (its Content-Security-Policy).
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const PLOT = { w: 600, h: 180, left: 44, right: 8, top: 8, bottom: 22 };
const SAMPLES = {
  en: "Hello, I am {name}. The kitchen lights are on.",
  zh: "你好，我是{name}。厨房的灯开着。",
  de: "Hallo, ich bin {name}. Das Licht in der Küche ist an.",
  fr: "Bonjour, je suis {name}. La lumière de la cuisine est allumée.",
  es: "Hola, soy {name}. La luz de la cocina está encendida.",
};
let clipQuery = "";
let lastRecent = null; // redrawn at the new width when the window changes size

function svg(tag, attrs, text) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

async function playBlob(blob, what) {
  const audio = $("audio");
  if (audio.src) URL.revokeObjectURL(audio.src);
  audio.src = URL.createObjectURL(blob);
  note("playing " + what);
  await audio.play();
}

// ---- the last minutes ---------------------------------------------------------------------

function median(values) {
  if (!values.length) return null;
  const s = [...values].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

function drawRecent(info) {
  lastRecent = info;
  const plot = $("plot");
  plot.replaceChildren();
  const { h, left, right, top, bottom } = PLOT;
  const w = Math.max(280, Math.round(plot.clientWidth) || PLOT.w); // text at its own size
  plot.setAttribute("viewBox", `0 0 ${w} ${h}`);
  const x = (t) => left + (w - left - right) * (1 - (info.now - t) / info.window_s);
  const lo = 0, hi = 4; // log10 ms: 1 ms .. 10 s
  const y = (ms) => {
    const v = Math.min(hi, Math.max(lo, Math.log10(Math.max(ms, 1))));
    return top + (h - top - bottom) * (1 - (v - lo) / (hi - lo));
  };
  for (const [ms, label] of [[1, "1"], [10, "10"], [100, "100"], [1000, "1 s"], [10000, "10 s"]]) {
    plot.append(svg("line", { class: "axis", x1: left, x2: w - right, y1: y(ms), y2: y(ms) }));
    plot.append(svg("text", { x: left - 6, y: y(ms) + 4, "text-anchor": "end" }, label));
  }
  const step = w < 450 ? 5 : 2; // minutes between labels
  for (let m = 0; m <= info.window_s / 60; m += step) {
    const t = info.now - m * 60;
    plot.append(svg("text", { x: x(t), y: h - 6, "text-anchor": m === 0 ? "end" : "middle" },
      m === 0 ? "now" : "−" + m + " min"));
  }
  const kinds = { cache: [], synthesis: [], say: [] };
  for (const r of info.requests) {
    const kind = r.kind === "say" ? "say" : r.source;
    (kinds[kind] || kinds.synthesis).push(r.first_audio_ms);
    const dot = svg("circle", { cx: x(r.at).toFixed(1), cy: y(r.first_audio_ms).toFixed(1), r: 4,
      class: kind });
    dot.append(svg("title", {}, `${r.first_audio_ms} ms · ${r.frontend} ${r.kind} · ${r.voice}` +
      ` · ${r.text}`));
    plot.append(dot);
  }
  const medians = Object.entries(kinds).filter(([, v]) => v.length)
    .map(([k, v]) => `${k} p50 ${median(v)} ms`);
  $("recent-count").textContent = info.requests.length + " requests" +
    (medians.length ? " · " + medians.join(", ") : "");
  document.body.dataset.recent = String(info.requests.length);
}

// ---- cached prompts -----------------------------------------------------------------------

function button(label, title, action) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.title = title;
  b.addEventListener("click", guarded(action));
  return b;
}

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  row.append(td);
  return td;
}

async function loadClips() {
  const query = new URLSearchParams({ q: clipQuery });
  if ($("pinned-only").checked) query.set("pinned", "1");
  const info = await (await api("v1/cache/clips?" + query)).json();
  const body = $("clips").tBodies[0];
  body.replaceChildren();
  for (const c of info.clips) {
    const tr = document.createElement("tr");
    tr.dataset.key = c.key;
    if (c.pinned) tr.className = "pinned";
    cell(tr, c.text, "text");
    cell(tr, c.voice);
    cell(tr, c.duration.toFixed(1), "num");
    cell(tr, String(c.hits), "num");
    const acts = cell(tr, "", "acts");
    acts.append(
      button("▶", "play the cached clip", () => playClip(c)),
      button("↻", "synthesize it again, as it was made", () => resynthesize(c)),
      button(c.pinned ? "unpin" : "pin", c.pinned ? "let it expire like any clip"
        : "keep it beyond the budget and the TTL", () => pin(c, !c.pinned)),
    );
    body.append(tr);
  }
  const s = info.stats;
  $("clip-count").textContent = `${info.matching} of ${s.clips} · ${s.pinned} pinned`;
  document.body.dataset.clips = String(info.clips.length);
}

async function playClip(c) {
  const response = await api("v1/cache/clips/" + encodeURIComponent(c.key) + "/audio");
  await playBlob(await response.blob(), `cached "${c.text.slice(0, 40)}"`);
  document.body.dataset.clipPlayed = c.key;
}

// Made anew by the daemon from what the clip was made with (every parameter: voice, speaker,
// speed, pitch, the engine's options, seed), stored over it and pinned if it was: the same key.
async function resynthesize(c) {
  const response = await api("v1/cache/clips/" + encodeURIComponent(c.key) + "/resynthesize", {});
  const key = response.headers.get("X-Speakd-Key");
  await playBlob(await response.blob(), `re-synthesized "${c.text.slice(0, 40)}"`);
  document.body.dataset.resynthesizedKey = key;
  document.body.dataset.resynthesized = response.headers.get("X-Speakd-Cache");
  await loadClips();
}

async function pin(c, pinned) {
  await api("v1/cache/clips/" + encodeURIComponent(c.key) + "/pin", { pinned });
  note((pinned ? "pinned " : "unpinned ") + `"${c.text.slice(0, 40)}"`);
  await loadClips();
}

// ---- voices -------------------------------------------------------------------------------

function sampleText(v) {
  const lang = (v.languages[0] || "en").slice(0, 2).toLowerCase();
  return (SAMPLES[lang] || SAMPLES.en).replace("{name}", v.id.split(/[-_]/)[2] || v.id);
}

async function loadVoicePanel() {
  const info = await (await api("v1/audio/voices")).json();
  const list = $("voice-list");
  list.replaceChildren();
  for (const v of info.voices) {
    const li = document.createElement("li");
    li.dataset.voice = v.id;
    const name = document.createElement("span");
    name.className = "name";
    name.textContent = v.id + (v.id === info.default ? " (default)" : "");
    const facts = document.createElement("span");
    facts.className = "facts";
    facts.textContent = `${v.engine} · ${(v.languages || []).join(", ")} · ${v.sample_rate} Hz` +
      (v.speakers.length > 1 ? ` · ${v.speakers.length} speakers` : "") +
      (v.loaded ? " · loaded" : "");
    const licence = document.createElement("span");
    licence.className = "licence" + (/NC/.test(v.licence) ? " nc" : "");
    licence.textContent = v.licence;
    li.append(name, facts, licence, button("▶ sample", "hear this voice", async () => {
      const response = await api("v1/audio/speech", {
        model: "speakd", input: sampleText(v), voice: v.id, response_format: "wav",
      });
      await playBlob(await response.blob(), v.id + " (cache " +
        response.headers.get("X-Speakd-Cache") + ")");
      document.body.dataset.sampled = v.id;
    }));
    list.append(li);
  }
}

async function refreshPanels() {
  try {
    drawRecent(await (await api("v1/recent")).json());
    await loadClips();
  } catch (e) { /* index.js's status line tells it (401 without the token) */ }
}

document.addEventListener("DOMContentLoaded", () => {
  let typing;
  $("search").addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => { clipQuery = $("search").value.trim(); guarded(loadClips)(); }, 250);
  });
  $("pinned-only").addEventListener("change", guarded(loadClips));
  window.addEventListener("resize", () => lastRecent && drawRecent(lastRecent));
  $("token").addEventListener("change", guarded(loadVoicePanel));
  guarded(loadVoicePanel)();
  refreshPanels();
  setInterval(refreshPanels, 3000);
});
