// ki-sidecar console: search, document view and operations dashboard over the public API.
// Plain DOM code, no framework; every text from the API goes in through textContent, never as HTML.
"use strict";

const TOKEN_KEY = "ki-console-token";
const state = { token: sessionStorage.getItem(TOKEN_KEY), me: null, request: null, lastAnswer: null, opsTimer: null,
  history: [] };

const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

class ApiError extends Error {
  constructor(status, body) {
    const field = body && body.field ? ` (field: ${body.field})` : "";
    super(`${(body && body.message) || `HTTP ${status}`}${field}`);
    this.status = status;
    this.code = body && body.error;
  }
}

async function api(path, body) {
  const headers = { Accept: "application/json" };
  if (state.token) headers.Authorization = `Bearer ${state.token}`;
  const init = { headers, method: body === undefined ? "GET" : "POST" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    throw new ApiError(0, { message: `the search API did not answer (${err.message})` });
  }
  let payload = null;
  try { payload = await response.json(); } catch (_) { payload = null; }
  if (!response.ok) throw new ApiError(response.status, payload);
  return payload;
}

function showError(message) {
  const box = $("error");
  box.textContent = message || "";
  box.hidden = !message;
}

function explainError(err) {
  if (err.status === 401) return `Sign-in failed: the token was not accepted — ${err.message}. Paste a valid token.`;
  if (err.status === 403) return `Not allowed: ${err.message}.`;
  return err.message;
}

// ---- sign-in ---------------------------------------------------------------------------------------------

async function signIn(token) {
  state.token = token.trim();
  try {
    state.me = await api("/v1/me");
  } catch (err) {
    state.token = null;
    state.me = null;
    sessionStorage.removeItem(TOKEN_KEY);
    showError(explainError(err));
    showView("signin");
    return false;
  }
  sessionStorage.setItem(TOKEN_KEY, state.token);
  showError("");
  renderWho();
  if (!location.hash || location.hash === "#/signin") location.hash = "#/search";
  else route();
  return true;
}

function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  Object.assign(state, { token: null, me: null, lastAnswer: null, request: null });
  $("results").replaceChildren();
  $("summary").textContent = "";
  renderWho();
  location.hash = "#/signin";
}

function renderWho() {
  const signedIn = Boolean(state.me);
  $("nav").hidden = !signedIn;
  $("sign-out").hidden = !signedIn;
  $("nav-ops").hidden = !(state.me && state.me.admin);
  $("who").textContent = signedIn ? `signed in as ${state.me.principals[0]}${state.me.admin ? " (administrator)" : ""}` : "";
}

let demoUsersAsked = 0;

async function loadDemoUsers(filter = "") {
  // Answers may arrive out of order: only the newest filter's answer is drawn, so a list never changes under
  // a click to show an older filter's users.
  const asked = ++demoUsersAsked;
  let answer;
  try {
    const response = await fetch(`/console/demo/users?q=${encodeURIComponent(filter)}`);
    if (!response.ok) return;  // not in demo mode
    answer = await response.json();
  } catch (_) { return; }
  if (asked !== demoUsersAsked) return;
  $("demo").hidden = false;
  $("demo-users").replaceChildren(...answer.users.map((user) => el("li", {},
    el("button", { type: "button", class: "demo-user", "data-principal": user.principal, text: user.label,
      onclick: () => demoSignIn(user.principal) }))));
}

async function demoSignIn(principal) {
  try {
    const minted = await api("/console/demo/token", { principal });
    await signIn(minted.token);
  } catch (err) {
    showError(explainError(err));
  }
}

// ---- search ----------------------------------------------------------------------------------------------

function ids(text) {
  return text.split(/[\s,;]+/).filter(Boolean).map(Number).filter((n) => Number.isInteger(n) && n > 0);
}

function readRequest(offset = 0) {
  const request = { query: $("q").value, limit: Number($("f-limit").value), offset, explain: true };
  if ($("mode").value) request.mode = $("mode").value;
  const filters = {};
  const projects = ids($("f-project").value);
  if (projects.length) filters.project_id = projects;
  if ($("f-status").value) filters.version_status = [$("f-status").value];
  if ($("f-language").value.trim()) filters.language = [$("f-language").value.trim()];
  if ($("f-from").value) filters.date_from = $("f-from").value;
  if ($("f-to").value) filters.date_to = $("f-to").value;
  if (Object.keys(filters).length) request.filters = filters;
  return request;
}

async function runSearch(request) {
  state.request = request;
  $("search").disabled = true;
  $("summary").textContent = "searching…";  // an answer like the last one still reads as new
  try {
    const answer = await api("/v1/search", request);
    state.lastAnswer = answer;
    showError("");
    renderResults(answer);
  } catch (err) {
    showError(explainError(err));
    if (err.status === 401) signOut();
  } finally {
    $("search").disabled = false;
  }
}

// Query words to mark in a snippet: a word matches when it starts with the query word's stem, so
// "Kündigung" also marks "Kündigungen" and "Kündigungsfrist".
function stems(query) {
  return query.toLocaleLowerCase("de").split(/[^\p{L}\p{N}§]+/u).filter((w) => w.length >= 3)
    .map((w) => (w.length > 5 ? w.slice(0, w.length - 2) : w));
}

function snippet(text, query, size = 420) {
  const words = stems(query);
  const lower = text.toLocaleLowerCase("de");
  let start = 0;
  for (const w of words) {
    const at = lower.indexOf(w);
    if (at >= 0) { start = Math.max(0, at - 120); break; }
  }
  const part = (start > 0 ? "…" : "") + text.slice(start, start + size) + (start + size < text.length ? "…" : "");
  const out = el("p", { class: "snippet" });
  for (const token of part.split(/([\p{L}\p{N}§]+)/u)) {
    const t = token.toLocaleLowerCase("de");
    if (token && words.some((w) => t.startsWith(w))) out.append(el("mark", { text: token }));
    else out.append(token);
  }
  return out;
}

function explainPanel(hit, answer) {
  const ex = hit.explain;
  const rows = Object.entries(ex.ranks).map(([leg, rank]) => el("tr", { "data-leg": leg },
    el("td", { text: leg }), el("td", { class: "rank", text: rank }), el("td", { text: ex.weights[leg] }),
    el("td", { class: "part", text: ex.rrf_parts[leg].toFixed(5) })));
  const fusion = ex.fusion || "rrf";  // rrf: weight / (k + rank); minmax, dbsf: weight × normalised score
  const facts = [
    ["fusion", fusion], [fusion === "rrf" ? "RRF score" : "fused legs", ex.rrf_score.toFixed(5)],
    ["status boost", ex.status_boost],
    ["decay", ex.decay === undefined || ex.decay === null ? "—" : ex.decay], ["fused score", ex.fused_score.toFixed(5)],
    ["rerank score", ex.rerank_score === null ? "—" : ex.rerank_score], ["match", hit.match_reason || "—"],
  ];
  const identity = answer.identity && answer.identity.outcome && answer.identity.outcome !== "none"
    ? el("p", { class: "identity", text: `identity: ${answer.identity.outcome}` +
      (answer.identity.subjects && answer.identity.subjects.length
        ? ` — ${answer.identity.subjects.map((s) => s.title || s.document_id).join(", ")}` : "") })
    : null;
  return el("div", { class: "explain", hidden: true },
    el("table", {}, el("thead", {}, el("tr", {},
      ["leg", "rank", "weight", fusion === "rrf" ? "RRF part" : "part"].map((h) => el("th", { text: h })))),
      el("tbody", {}, rows)),
    el("table", {}, el("tbody", {}, facts.map(([k, v]) => el("tr", {}, el("th", { text: k }), el("td", { text: v }))))),
    identity);
}

// The document view opened at the hit: its version, its passage (a body chunk's span) and its chunk.
function hitLink(hit) {
  const at = new URLSearchParams({ version: hit.version_id });
  if (hit.span) { at.set("start", hit.span.start); at.set("end", hit.span.end); }
  if (hit.chunk_id) at.set("chunk", hit.chunk_id);
  return `#/doc/${hit.document_id}?${at}`;
}

function renderHit(hit, answer, query) {
  const panel = explainPanel(hit, answer);
  const toggle = el("button", { type: "button", class: "link explain-toggle", text: "Explain",
    onclick: () => { panel.hidden = !panel.hidden; toggle.textContent = panel.hidden ? "Explain" : "Hide explain"; } });
  const c = hit.citation;
  return el("li", { class: "hit", "data-document-id": hit.document_id },
    el("h3", {}, el("a", { href: hitLink(hit), text: hit.title })),
    el("div", { class: "meta" },
      el("span", { class: `badge ${hit.version_status}`, text: hit.version_status || "?" }),
      `${hit.doc_date || "undated"} · version ${hit.version_no} · ${hit.chunk_kind}` +
        (hit.locus ? ` · ${hit.locus}` : "") +
        (hit.matched_identifiers.length ? ` · matched ${hit.matched_identifiers.join(", ")}` : "")),
    snippet(hit.text, query),
    el("div", { class: "citation", text: `cite: project ${c.project_id} · document ${c.document_id} · version ` +
      `${c.version_id} · source objects ${c.source_object_ids.join(", ") || "—"} · chunk ${c.chunk_id}` }),
    toggle, panel);
}

function renderResults(answer) {
  const request = state.request;
  const mode = answer.mode ? `${answer.mode.used} (${answer.mode.reason})` : "";
  const first = answer.hits.length ? request.offset + 1 : 0;
  const why = answer.hits.length || !answer.reason ? "" : ` · no hits: ${answer.reason}`;
  $("summary").textContent = `hits ${first}–${request.offset + answer.hits.length}${answer.has_more ? " (more)" : ""}` +
    ` · mode ${mode}${answer.timings_ms ? ` · ${Math.round(answer.timings_ms.total)} ms` : ""}${why}`;  // operators only
  $("results").replaceChildren(...answer.hits.map((hit) => renderHit(hit, answer, request.query)));
  $("prev").hidden = request.offset === 0;
  $("next").hidden = !answer.has_more;
}

// ---- document view ---------------------------------------------------------------------------------------

// `wanted`: what the route names (the hit's version, passage and chunk), each null when not named.
async function renderDocument(id, wanted) {
  const box = $("doc");
  box.replaceChildren(el("p", { class: "hint", text: "loading…" }));
  let doc, related;
  try {
    [doc, related] = await Promise.all([api(`/v1/documents/${id}`), api(`/v1/documents/${id}/related`)]);
  } catch (err) {
    box.replaceChildren(el("p", { class: "hint", text: err.status === 404 ? "No document you may see has this id." : "" }));
    if (err.status !== 404) showError(explainError(err));
    return;
  }
  const versions = doc.versions.map((v) => el("tr", { class: "version", "data-version-id": v.version_id },
    el("td", { text: v.version_no }), el("td", {}, el("span", { class: `badge ${v.status}`, text: v.status })),
    el("td", { text: v.doc_date || "—" }), el("td", { text: v.language }), el("td", { text: v.latest_final ? "yes" : "" }),
    el("td", { text: count(v.chars) }), el("td", { text: v.source_object_ids.join(", ") })));
  const links = related.related.map((r) => el("li", { class: "related" },
    `${r.kind} (${r.direction}) `, el("a", { href: `#/doc/${r.document.document_id}`, text: r.document.title })));
  const reader = textSection(doc, wanted);
  box.replaceChildren(
    el("h1", { text: doc.title }),
    el("p", { class: "meta", text: [doc.identifiers.join(", "), doc.matter && doc.matter.title,
      doc.doc_type && doc.doc_type.label].filter(Boolean).join(" · ") }),
    el("h2", { text: "Versions you may see" }),
    el("table", { class: "doc" }, el("thead", {}, el("tr", {},
      ["no.", "status", "date", "language", "latest final", "characters", "source objects"]
        .map((h) => el("th", { text: h })))),
    el("tbody", {}, versions)),
    reader.section,
    el("h2", { text: "Related documents" }),
    links.length ? el("ul", {}, links) : el("p", { class: "hint", text: "none you may see" }));
  reader.start();
}

// ---- a version's text ------------------------------------------------------------------------------------

const PAGE_CHARS = 2000;

// The page's text cut where the hit's passage and the instruction-like passages begin and end. Offsets count
// characters (code points) as the API does; a JavaScript string counts UTF-16 units, hence Array.from.
// `passage`: {start, end} into the whole version's text, or null; `flagged`: spans into the page's text. Pure.
function textSegments(text, offset, passage, flagged) {
  const chars = Array.from(text);
  const clip = (at) => Math.max(0, Math.min(chars.length, at));
  const hit = passage ? [clip(passage.start - offset), clip(passage.end - offset)] : [0, 0];
  const marks = (flagged || []).map((s) => [clip(s.start), clip(s.end), s.kind]).filter(([a, b]) => b > a);
  const cuts = new Set([0, chars.length, ...hit, ...marks.flatMap(([a, b]) => [a, b])]);
  const points = [...cuts].sort((a, b) => a - b);
  const segments = [];
  for (let i = 0; i + 1 < points.length; i += 1) {
    const [a, b] = [points[i], points[i + 1]];
    segments.push({ text: chars.slice(a, b).join(""), passage: hit[0] <= a && b <= hit[1],
      kinds: marks.filter(([s, e]) => s <= a && b <= e).map(([, , kind]) => kind) });
  }
  return segments;
}

// Document text is untrusted: it goes in as text nodes only. The hit's passage (its part on this page) is one
// <mark class="passage">; instruction-like passages are <span class="injection"> inside or around it.
function renderSegments(segments) {
  const nodes = [];
  let passage = null;
  for (const s of segments) {
    const node = s.kinds.length
      ? el("span", { class: "injection", title: `reads as an instruction to a language model: ${s.kinds.join(", ")}`,
        text: s.text })
      : document.createTextNode(s.text);
    if (!s.passage) { passage = null; nodes.push(node); continue; }
    if (!passage) { passage = el("mark", { class: "passage", title: "the hit's passage" }); nodes.push(passage); }
    passage.append(node);
  }
  return nodes;
}

// A path of this API (a permalink) as text, and a link that opens its JSON with the caller's token, here.
function permalink(path, target) {
  if (typeof path !== "string" || !path.startsWith("/v1/")) return el("span", { text: "—" });
  const open = async (event) => {
    event.preventDefault();
    try {
      target.textContent = JSON.stringify(await api(path), null, 2);
      target.hidden = false;
      showError("");
    } catch (err) {
      showError(explainError(err));
    }
  };
  return el("span", {}, el("code", { class: "permalink", text: path }), " ",
    el("a", { href: path, class: "open-json", onclick: open, text: "open the JSON" }));
}

// Where the file is opened: each citable source object's kind and ref, a link only when the API's link (the
// ref through its kind's URL template, `api.evidence.source_urls`) is a web address; else the ref as text.
function sourceList(evidence) {
  const sources = evidence.sources || evidence.source_object_ids.map((id) => ({ source_object_id: id }));
  if (!sources.length) return el("span", { id: "text-sources", text: "none" });
  return el("ul", { id: "text-sources", class: "sources" }, sources.map((o) => {
    const ref = o.external_ref || "";
    const web = typeof o.link === "string" && /^https?:\/\//i.test(o.link);
    return el("li", { class: "source", "data-source-object-id": o.source_object_id },
      `object ${o.source_object_id}${o.kind ? ` · ${o.kind}` : ""}${ref || web ? " · " : ""}`,
      web ? el("a", { href: o.link, target: "_blank", rel: "noopener noreferrer", title: o.link, text: ref || o.link })
        : (ref ? el("code", { text: ref }) : null));
  }));
}

function textSection(doc, wanted) {
  const visible = new Map(doc.versions.map((v) => [v.version_id, v]));
  const named = wanted.version !== null;
  const fromHit = named && visible.has(wanted.version);
  const hitVersion = fromHit ? wanted.version : null;
  const passage = fromHit && wanted.start !== null && wanted.end !== null && wanted.end > wanted.start
    ? { start: wanted.start, end: wanted.end } : null;
  const select = el("select", { id: "text-version" }, doc.versions.map((v) => el("option",
    { value: v.version_id, text: `version ${v.version_no} · ${v.status} · ${count(v.chars)} characters` })));
  select.value = String(fromHit ? hitVersion : doc.citation.version_id);
  const prev = el("button", { type: "button", id: "text-prev", "aria-label": "previous page of the text",
    text: "← Previous", disabled: true });
  const next = el("button", { type: "button", id: "text-next", "aria-label": "next page of the text",
    text: "Next →", disabled: true });
  const range = el("span", { id: "text-range", class: "hint", "aria-live": "polite" });
  const notes = el("div", { id: "text-notes" });
  const body = el("pre", { id: "doc-text", class: "doc-text", tabindex: 0, "aria-label": "the version's text" });
  const evidence = el("dl", { id: "text-evidence", class: "evidence" });
  const json = el("pre", { id: "text-json", class: "json", hidden: true, "aria-label": "the permalink's JSON" });
  const shown = { version: Number(select.value), offset: 0, next: null };
  let asked = 0;

  const hint = (text) => el("p", { class: "hint", text });
  async function load(version, offset, scroll = false) {
    const mine = ++asked;  // only the last page asked for is shown
    prev.disabled = true;
    next.disabled = true;
    range.textContent = "loading…";
    let slice;
    try {
      slice = await api(`/v1/documents/${doc.document_id}/versions/${version}/text?offset=${offset}&length=${PAGE_CHARS}`);
    } catch (err) {
      if (mine !== asked) return;
      range.textContent = err.status === 404 ? "No version you may see has this id." : "";
      body.replaceChildren();
      evidence.replaceChildren();
      if (err.status !== 404) showError(explainError(err));
      return;
    }
    if (mine !== asked) return;
    Object.assign(shown, { version, offset: slice.offset, next: slice.next_offset });
    const here = version === hitVersion && passage ? passage : null;
    const pageEnd = slice.offset + slice.length;
    const onPage = here && here.start < pageEnd && here.end > slice.offset;
    const redacted = slice.injection && slice.injection.redacted;
    const flagged = slice.injection && slice.injection.flagged && !redacted ? slice.injection.spans : [];
    // A redacted page's text no longer has the stored offsets: the passage cannot be marked on it.
    body.replaceChildren(...renderSegments(textSegments(slice.text, slice.offset, onPage && !redacted ? here : null, flagged)));
    body.dataset.offset = slice.offset;
    body.dataset.versionId = version;
    const pages = Math.max(1, Math.ceil(slice.total_chars / PAGE_CHARS));
    range.textContent = slice.length
      ? `characters ${count(slice.offset + 1)}–${count(pageEnd)} of ${count(slice.total_chars)}` +
        ` · page ${Math.floor(slice.offset / PAGE_CHARS) + 1} of ${pages}`
      : `no characters here (the text has ${count(slice.total_chars)})`;
    prev.disabled = slice.offset === 0;
    next.disabled = slice.next_offset === null;
    const said = [];
    if (here) {
      said.push(hint(`The hit's passage: characters ${count(here.start + 1)}–${count(here.end)}` +
        (onPage ? (here.start < slice.offset || here.end > pageEnd ? " (it goes on beyond this page)" : " (marked)")
          : " (on another page)") + "."));
    }
    if (redacted) said.push(hint("Passages that read as instructions to a language model were removed from this page."));
    else if (flagged.length) {
      said.push(el("p", { class: "hint injection-note", text:
        "Passages marked like this read as instructions to a language model: they are part of the document, not instructions to you." }));
    }
    notes.replaceChildren(...said);
    const v = visible.get(version);
    const rows = [
      ["SHA-256 of this page", el("code", { id: "text-sha256", text: slice.evidence.sha256 })],
      ["SHA-256 of the whole version", el("code", { id: "text-version-sha256", text: slice.evidence.version_sha256 })],
      ["Permalink", permalink(slice.evidence.permalink, json)],
      ["Source objects you may cite it at", sourceList(slice.evidence)],
      ["Version", `${v ? v.version_no : "?"} (id ${version}, ${slice.status}${slice.latest_final ? ", latest final" : ""})`],
    ];
    if (version === hitVersion && wanted.chunk) rows.push(["The hit's chunk", permalink(`/v1/chunks/${wanted.chunk}`, json)]);
    evidence.replaceChildren(...rows.flatMap(([term, value]) => [el("dt", { text: term }), el("dd", {}, value)]));
    json.hidden = true;
    json.textContent = "";
    if (scroll) {
      const mark = body.querySelector("mark.passage");
      if (mark) mark.scrollIntoView({ block: "center" });
    }
  }

  select.addEventListener("change", () => load(Number(select.value), 0));
  prev.addEventListener("click", () => load(shown.version, Math.max(0, shown.offset - PAGE_CHARS)));
  next.addEventListener("click", () => { if (shown.next !== null) load(shown.version, shown.next); });
  const section = el("section", { class: "text", "aria-labelledby": "text-heading" },
    el("h2", { id: "text-heading", text: "Text" }),
    named && !fromHit ? hint("No version you may see has this id; the version the document is cited by is shown.") : null,
    el("div", { class: "text-pager" }, el("label", { for: "text-version", text: "Version" }), select, prev, next, range),
    notes, body,
    el("h3", { text: "Evidence" }), evidence, json);
  const first = passage ? Math.floor(passage.start / PAGE_CHARS) * PAGE_CHARS : 0;
  return { section, start: () => load(shown.version, first, Boolean(passage)) };
}

// ---- operations dashboard --------------------------------------------------------------------------------

const BYTES = ["B", "KiB", "MiB", "GiB", "TiB"];
function bytes(n) {
  if (n === null || n === undefined) return "—";
  let i = 0, v = n;
  while (v >= 1024 && i < BYTES.length - 1) { v /= 1024; i += 1; }
  return `${i ? v.toFixed(1) : v} ${BYTES[i]}`;
}
const seconds = (s) => (s === null || s === undefined ? "—" : s < 1 ? `${Math.round(s * 1000)} ms` : `${s.toFixed(2)} s`);
const count = (n) => (n === null || n === undefined ? "—" : n.toLocaleString("en"));

function figure(key, label, raw, shown, sub, down = false, wide = false) {
  return el("div", { class: `figure${down ? " down" : ""}${wide ? " wide" : ""}`, "data-key": key },
    el("div", { class: "label", text: label }),
    el("div", { class: "value", "data-value": raw === null || raw === undefined ? "" : raw, text: shown }),
    sub ? el("div", { class: "sub", text: sub }) : null);
}

function sparkline(label, points, format) {
  const w = 320, h = 80;
  const max = Math.max(...points.map((p) => p ?? 0), 1e-9);
  const step = points.length > 1 ? w / (points.length - 1) : w;
  const coords = points.map((p, i) => `${(i * step).toFixed(1)},${(h - ((p ?? 0) / max) * (h - 6) - 3).toFixed(1)}`);
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.setAttribute("preserveAspectRatio", "none");
  const base = document.createElementNS(ns, "line");
  for (const [k, v] of Object.entries({ x1: 0, y1: h - 1, x2: w, y2: h - 1 })) base.setAttribute(k, v);
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("points", coords.join(" "));
  svg.append(base, line);
  const last = points[points.length - 1];
  return el("div", { class: "figure chart" }, el("div", { class: "label", text: `${label}: ${format(last)}` }), svg,
    el("div", { class: "sub", text: `max ${format(max)} over the last ${points.length} readings` }));
}

function renderOps(o) {
  const figures = [];
  const idx = o.index;
  figures.push(figure("alias-target", `alias ${idx.alias || "?"} →`, idx.targets.join(","),
    idx.targets.join(", ") || "—", idx.error ? `not refreshed: ${idx.error}` : "", Boolean(idx.error), true));
  figures.push(figure("index-size", "index size", idx.size_bytes, bytes(idx.size_bytes), `${count(idx.size_bytes)} bytes`));
  figures.push(figure("index-rows", "index rows (chunks)", idx.rows, count(idx.rows)));
  figures.push(figure("dlq-records", "dead-letter records", o.dlq_records, count(o.dlq_records)));
  const dlq = o.dlq_waiting;
  figures.push(figure("dlq-waiting", "dead letters waiting (ki dlq list)", dlq ? dlq.records : null,
    dlq ? count(dlq.records) : "—",
    dlq ? (dlq.records ? `oldest waiting ${dlq.oldest_s} s: replay or drop it` : "every dead letter handled")
      : "no lane answered", Boolean(dlq && dlq.records)));
  figures.push(figure("slot-retained", "replication slot WAL retained", o.slot_retained_bytes, bytes(o.slot_retained_bytes)));
  const pending = o.vectors_pending;
  figures.push(figure("vectors-pending", "rows waiting for their vector", pending ? pending.rows : null,
    pending ? count(pending.rows) : "—",
    pending ? (pending.rows ? `oldest waiting ${pending.oldest_s} s (keyword-searchable already)` : "every vector in place")
      : "no content lane answered"));
  for (const [lane, l] of Object.entries(o.lanes)) {
    if (!l.up) {
      figures.push(figure(`lag-${lane}`, `${lane} lane`, null, "down", l.error, true));
      continue;
    }
    figures.push(figure(`lag-${lane}`, `${lane} lane lag`, l.lag, count(l.lag),
      l.paused ? `paused: ${l.paused.replaceAll("_", " ")} (resumes by itself once writes are allowed)`
        : l.topics.filter((t) => t.lag).map((t) => `${t.topic} ${t.lag}`).join(", ") || "every topic caught up",
      Boolean(l.paused)));
    figures.push(figure(`fresh-${lane}`, `${lane}: commit → indexed p50 / p99`, l.freshness_p99_s,
      `${seconds(l.freshness_p50_s)} / ${l.freshness_p99_beyond ? "> " : ""}${seconds(l.freshness_p99_s)}`,
      `${count(l.freshness_events)} events in the window`));
  }
  const a = o.api;
  figures.push(figure("api-rate", "API requests / s", a.requests_per_s, a.requests_per_s.toFixed(2),
    `${count(a.requests)} in ${Math.round(o.covered_s)} s · ${a.in_flight} in flight`));
  figures.push(figure("api-latency", "API latency p50 / p99", a.latency_p99_s,
    `${seconds(a.latency_p50_s)} / ${seconds(a.latency_p99_s)}`));
  $("ops").replaceChildren(...figures);

  const lag = Object.values(o.lanes).reduce((sum, l) => sum + (l.up ? l.lag : 0), 0);
  const fresh = Math.max(0, ...Object.values(o.lanes).map((l) => (l.up ? l.freshness_p99_s ?? 0 : 0)));
  state.history.push({ lag, fresh, rate: a.requests_per_s, latency: a.latency_p99_s ?? 0 });
  state.history = state.history.slice(-60);
  const series = (k) => state.history.map((p) => p[k]);
  $("charts").replaceChildren(
    sparkline("consumer lag (all lanes)", series("lag"), count),
    sparkline("commit → indexed p99", series("fresh"), seconds),
    sparkline("API requests / s", series("rate"), (v) => v.toFixed(2)),
    sparkline("API latency p99", series("latency"), seconds));
  $("ops-updated").textContent = `updated ${new Date(o.at * 1000).toLocaleTimeString()} · window ${Math.round(o.window_s)} s`;
}

async function refreshOps() {
  try {
    renderOps(await api("/v1/ops/overview"));
    showError("");
  } catch (err) {
    showError(explainError(err));
    if (err.status === 401 || err.status === 403) stopOps();
  }
}

function stopOps() {
  if (state.opsTimer) clearInterval(state.opsTimer);
  state.opsTimer = null;
}

// ---- routing ---------------------------------------------------------------------------------------------

function showView(name) {
  for (const view of document.querySelectorAll(".view")) view.hidden = view.id !== `view-${name}`;
  for (const link of document.querySelectorAll("#nav a")) link.classList.toggle("active", link.dataset.view === name);
  if (name !== "ops") stopOps();
}

// `#/doc/12?version=34&start=100&end=900&chunk=34:chunk:2`: the hit's version, passage and chunk (all optional).
function wantedText(query) {
  const at = new URLSearchParams(query || "");
  const number = (key) => (/^\d+$/.test(at.get(key) || "") ? Number(at.get(key)) : null);
  const chunk = at.get("chunk");
  return { version: number("version"), start: number("start"), end: number("end"),
    chunk: chunk && /^\d+:[a-z]+:-?\d+$/.test(chunk) ? chunk : null };
}

function route() {
  const hash = location.hash || "#/search";
  if (!state.me) { showView("signin"); return; }
  const doc = hash.match(/^#\/doc\/(\d+)(?:\?(.*))?$/);
  if (doc) { showView("doc"); renderDocument(doc[1], wantedText(doc[2])); return; }
  if (hash === "#/ops") {
    showView("ops");
    if (!state.opsTimer) { refreshOps(); state.opsTimer = setInterval(refreshOps, 3000); }
    return;
  }
  showView("search");
}

function start() {
  $("signin-form").addEventListener("submit", (e) => { e.preventDefault(); signIn($("token").value); });
  $("sign-out").addEventListener("click", signOut);
  $("search-form").addEventListener("submit", (e) => { e.preventDefault(); runSearch(readRequest(0)); });
  $("prev").addEventListener("click", () => runSearch({ ...state.request, offset: Math.max(0, state.request.offset - state.request.limit) }));
  $("next").addEventListener("click", () => runSearch({ ...state.request, offset: state.request.offset + state.request.limit }));
  let pending = null;
  $("demo-filter").addEventListener("input", (e) => {
    clearTimeout(pending);
    pending = setTimeout(() => loadDemoUsers(e.target.value), 200);
  });
  window.addEventListener("hashchange", route);
  loadDemoUsers();
  if (state.token) signIn(state.token);
  else route();
}

document.addEventListener("DOMContentLoaded", start);
