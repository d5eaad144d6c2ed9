// sailrl studio: the page. Plain JavaScript module, no framework, no build step.
// Every text that comes from a spec, a dataset or a model is put in the page with textContent, never as HTML.

const $ = (sel) => document.querySelector(sel);

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "value") el.value = v;
    else if (k === "checked") el.checked = !!v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const S = {
  text: "", loadedText: "", baseSha: null, check: null, rules: [], examples: [],
  row: null, fields: {}, lastTry: null, run: null, runMetrics: [], runNext: 0, runFile: null, runSteps: { train: [], eval: [] },
  records: [], dataOffset: 0, tab: "rules", diskNotice: null,
  open: new Set(), labels: [], agreement: {}, proposals: [], starters: [], exampleResults: [], runStatus: null,
};

async function api(path, body) {
  const opts = body === undefined ? { method: "GET" } :
    { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) };
  opts.credentials = "same-origin";
  const resp = await fetch(path, opts);
  let data = null;
  try { data = await resp.json(); } catch { data = { error: `${resp.status} ${resp.statusText}` }; }
  if (!resp.ok) { const err = new Error(data && data.error || resp.statusText); err.status = resp.status; throw err; }
  return data;
}

function status(text, kind = "") { const el = $("#status"); el.textContent = text; el.className = "status " + kind; }

function banner(text, kind = "", action = null) {
  const el = $("#banner");
  el.replaceChildren();
  if (!text) { el.hidden = true; return; }
  el.hidden = false;
  el.className = "banner " + kind;
  el.append(text);
  if (action) el.append(" ", h("button", { type: "button", onclick: action.run }, action.label));
}

function debounce(fn, ms) {
  let t = null;
  return (...args) => { clearTimeout(t); t = setTimeout(() => fn(...args), ms); };
}

// One request in flight at a time; while it runs, only the newest next call waits (older ones are dropped).
function latest(fn) {
  let running = false, queued = null;
  const go = async (...args) => {
    if (running) { queued = args; return; }
    running = true;
    try { await fn(...args); } finally {
      running = false;
      if (queued) { const a = queued; queued = null; go(...a); }
    }
  };
  return go;
}

// ------------------------------------------------------------------------------------------ rule forms

const FLAGS = ["DOTALL", "IGNORECASE", "MULTILINE", "VERBOSE", "ASCII"];
const EXTRACT_FROM = ["boxed", "regex", "last_number", "after_marker", "whole"];
const CHECK_KINDS = ["has_answer", "match", "termination", "length"];
const DEFAULTS = {
  answer: () => ({ extract: { from: "boxed" }, compare: "numeric" }),
  match: () => ({ pattern: "" }),
  length: () => ({ unit: "tokens", max: 256 }),
  termination: () => ({}),
  has_answer: () => ({ extract: { from: "boxed" } }),
  all_of: () => ({ checks: [{ kind: "has_answer", extract: { from: "boxed" } }, { kind: "termination" }] }),
  any_of: () => ({ checks: [{ kind: "has_answer", extract: { from: "boxed" } }, { kind: "match", pattern: "^Answer:" }] }),
  python: () => ({ function: "rewards:score" }),
};

function getAt(obj, path) { return path.reduce((o, k) => (o == null ? undefined : o[k]), obj); }
function setAt(obj, path, value) {
  let o = obj;
  for (const k of path.slice(0, -1)) { if (o[k] == null || typeof o[k] !== "object") o[k] = {}; o = o[k]; }
  const last = path[path.length - 1];
  if (value === undefined || value === "" || (Array.isArray(value) && value.length === 0 && last === "flags")) delete o[last];
  else o[last] = value;
}

// One line of help for every field, in plain words (the spec's own word is the label beside it).
const HELP = {
  from: "where the answer is taken from: the last \\boxed{}, a pattern, the last number, after a marker, or the whole reply",
  occurrence: "when the reply has several answers: use the last one or the first one",
  "if none found": "when no answer is found: fail (none) or read the whole reply as the answer (whole)",
  pattern: "a regular expression; press \u201cmatch this text exactly\u201d to look for the text as you typed it",
  flags: "DOTALL: '.' also matches line breaks; IGNORECASE: capitals do not matter; MULTILINE: ^ and $ match at every line",
  marker: "the answer is what follows this text, e.g. ####",
  compare: "how the reply's answer is compared with the reference: as a number (numeric), as maths (math), as text (exact, normalized)",
  abs_tol: "how far from the reference a number may be and still count as equal (e.g. 0.01)",
  rel_tol: "the same, as a fraction of the reference (0.01 = 1%)",
  mode: "search: the pattern may match anywhere; fullmatch: the whole reply must match it",
  negate: "turn the rule round: pass when the pattern is NOT found",
  unit: "count the reply's length in tokens or in characters",
  min: "the shortest a reply may be", max: "the longest a reply may be",
  field: "the row's field that holds the right answer",
  function: "module:function in a file next to the spec",
  timeout_s: "seconds the function may take before the rule fails",
  scores: "how a pass and a fail count towards the total",
  weight: "what a pass adds to the total (a fail adds 0)",
  "pass score": "what a pass adds to the total", "fail score": "what a fail adds to the total (e.g. -0.1)",
};

function fieldRow(label, keyPath, input, helpText) {
  const help = helpText || HELP[label];
  return h("div", { class: "field", dataset: { path: keyPath } }, h("label", {}, label), input,
    help ? h("span", { class: "help field-help" }, help) : null);
}

// What a regular expression treats as special, escaped: the text is then matched exactly as typed.
function escapeRegex(text) { return text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"); }

function patternInput(rule, path, keyPath, placeholder) {
  const input = textInput(rule, path, keyPath, placeholder);
  const exact = h("button", { type: "button", class: "match-exactly", title: "escape what a regular expression treats as special",
    onclick: () => { input.value = escapeRegex(input.value); setAt(rule, path, input.value || undefined); formsChanged(); } },
  "match this text exactly");
  return h("span", { class: "pattern-box" }, input, exact);
}

function textInput(rule, path, keyPath, placeholder) {
  const v = getAt(rule, path);
  return h("input", { type: "text", value: v == null ? "" : String(v), placeholder, dataset: { path: keyPath },
    oninput: (e) => { setAt(rule, path, e.target.value === "" ? undefined : e.target.value); formsChanged(); } });
}

function numberInput(rule, path, keyPath, integer = false) {
  const v = getAt(rule, path);
  return h("input", { type: "number", step: integer ? "1" : "any", value: v == null ? "" : String(v),
    dataset: { path: keyPath },
    oninput: (e) => {
      const raw = e.target.value;
      setAt(rule, path, raw === "" ? undefined : (integer ? parseInt(raw, 10) : parseFloat(raw)));
      formsChanged();
    } });
}

function selectInput(rule, path, keyPath, options, onchange) {
  const v = getAt(rule, path);
  const sel = h("select", { dataset: { path: keyPath } },
    options.map((o) => h("option", { value: o, selected: o === v }, o)));
  if (v === undefined) sel.value = options[0];
  sel.addEventListener("change", (e) => {
    setAt(rule, path, e.target.value);
    if (onchange) onchange(e.target.value); else formsChanged();
  });
  return sel;
}

function flagsInput(rule, path, keyPath) {
  const have = new Set(getAt(rule, path) || []);
  return h("span", { dataset: { path: keyPath } }, FLAGS.map((f) => h("label", {},
    h("input", { type: "checkbox", checked: have.has(f), onchange: (e) => {
      if (e.target.checked) have.add(f); else have.delete(f);
      setAt(rule, path, FLAGS.filter((x) => have.has(x)));
      formsChanged();
    } }), f, " ")));
}

function extractorForm(rule, path, keyPath, title) {
  const ex = getAt(rule, path) || {};
  const box = h("div", { class: "group", dataset: { path: keyPath } }, h("div", { class: "group-title" }, title));
  const from = ex.from || "boxed";
  box.append(fieldRow("from", `${keyPath}.from`, selectInput(rule, [...path, "from"], `${keyPath}.from`, EXTRACT_FROM,
    (v) => {
      const e = getAt(rule, path);
      if (v !== "regex") { delete e.pattern; delete e.flags; } else if (!e.pattern) e.pattern = "Answer: (\\S+)";
      if (v !== "after_marker") delete e.marker; else if (!e.marker) e.marker = "####";
      formsChanged(); renderRules();
    })));
  if (from === "regex") {
    box.append(fieldRow("pattern", `${keyPath}.pattern`, patternInput(rule, [...path, "pattern"], `${keyPath}.pattern`,
      "a regular expression with a capture group"), "the answer is the capture group"));
    box.append(fieldRow("flags", `${keyPath}.flags`, flagsInput(rule, [...path, "flags"], `${keyPath}.flags`)));
  }
  if (from === "after_marker") {
    box.append(fieldRow("marker", `${keyPath}.marker`, textInput(rule, [...path, "marker"], `${keyPath}.marker`, "####")));
  }
  box.append(fieldRow("occurrence", `${keyPath}.occurrence`,
    selectInput(rule, [...path, "occurrence"], `${keyPath}.occurrence`, ["last", "first"])));
  box.append(fieldRow("if none found", `${keyPath}.fallback`,
    selectInput(rule, [...path, "fallback"], `${keyPath}.fallback`, ["none", "whole"])));
  return box;
}

function kindFields(rule, base, keyPath, kind) {
  const out = [];
  const at = (...p) => [...base, ...p];
  const kp = (...p) => [keyPath, ...p].join(".");
  if (kind === "answer") {
    out.push(extractorForm(rule, at("extract"), kp("extract"), "answer in the completion"));
    const refBox = h("div", { class: "group", dataset: { path: kp("reference") } },
      h("div", { class: "group-title" }, "reference answer"),
      fieldRow("field", kp("reference", "field"), textInput(rule, at("reference", "field"), kp("reference", "field"),
        "default: prompt.reference_field")));
    const refEx = getAt(rule, at("reference", "extract"));
    if (refEx == null) {
      refBox.append(h("div", { class: "field" }, h("label", {}, "extract"), h("span", { class: "help" }, "the whole field"),
        h("button", { type: "button", onclick: () => { setAt(rule, at("reference", "extract"), { from: "after_marker", marker: "####" }); formsChanged(); renderRules(); } }, "extract from it")));
    } else {
      refBox.append(extractorForm(rule, at("reference", "extract"), kp("reference", "extract"), "taken from the field"));
    }
    out.push(refBox);
    out.push(fieldRow("compare", kp("compare"), selectInput(rule, at("compare"), kp("compare"),
      ["normalized", "exact", "numeric", "math"], () => { formsChanged(); renderRules(); })));
    if (getAt(rule, at("compare")) === "numeric") {
      out.push(fieldRow("abs_tol", kp("abs_tol"), numberInput(rule, at("abs_tol"), kp("abs_tol"))));
      out.push(fieldRow("rel_tol", kp("rel_tol"), numberInput(rule, at("rel_tol"), kp("rel_tol"))));
    }
  } else if (kind === "match") {
    out.push(fieldRow("pattern", kp("pattern"), patternInput(rule, at("pattern"), kp("pattern"), "a regular expression")));
    out.push(fieldRow("mode", kp("mode"), selectInput(rule, at("mode"), kp("mode"), ["search", "fullmatch"])));
    out.push(fieldRow("flags", kp("flags"), flagsInput(rule, at("flags"), kp("flags"))));
    out.push(fieldRow("negate", kp("negate"), h("input", { type: "checkbox", checked: !!getAt(rule, at("negate")),
      dataset: { path: kp("negate") },
      onchange: (e) => { setAt(rule, at("negate"), e.target.checked ? true : undefined); formsChanged(); } }),
      HELP.negate));
  } else if (kind === "length") {
    out.push(fieldRow("unit", kp("unit"), selectInput(rule, at("unit"), kp("unit"), ["tokens", "chars"])));
    out.push(fieldRow("min", kp("min"), numberInput(rule, at("min"), kp("min"), true)));
    out.push(fieldRow("max", kp("max"), numberInput(rule, at("max"), kp("max"), true)));
  } else if (kind === "has_answer") {
    out.push(extractorForm(rule, at("extract"), kp("extract"), "answer to look for"));
  } else if (kind === "termination") {
    out.push(h("p", { class: "help" }, "Passes when the completion ended cleanly (not cut off at max_tokens)."));
  } else if (kind === "python") {
    out.push(fieldRow("function", kp("function"), textInput(rule, at("function"), kp("function"), "rewards:score"),
      "module:function in a file next to the spec"));
    out.push(fieldRow("timeout_s", kp("timeout_s"), numberInput(rule, at("timeout_s"), kp("timeout_s"))));
    const fn = getAt(rule, at("function"));
    if (typeof fn === "string" && fn.includes(":")) {
      const file = fn.split(":")[0].replaceAll(".", "/") + ".py";
      const pre = h("pre", { class: "text" }, "…");
      out.push(h("details", { ontoggle: async (e) => {
        if (!e.target.open) return;
        try { pre.textContent = (await api(`/api/source?path=${encodeURIComponent(file)}`)).text; }
        catch (err) { pre.textContent = err.message; }
      } }, h("summary", {}, `show ${file}`), pre));
    }
  } else if (kind === "all_of" || kind === "any_of") {
    const checks = getAt(rule, at("checks")) || [];
    const box = h("div", { class: "group", dataset: { path: kp("checks") } },
      h("div", { class: "group-title" }, kind === "all_of" ? "every one of these checks must pass" :
        "at least one of these checks must pass"));
    checks.forEach((c, j) => {
      const ck = h("div", { class: "check", dataset: { path: kp("checks", j) } },
        h("div", { class: "rule-head" }, h("span", { class: "num" }, `check ${j + 1}`),
          selectInput(rule, at("checks", j, "kind"), kp("checks", j, "kind"), CHECK_KINDS, (v) => {
            checks[j] = { kind: v, ...DEFAULTS[v]() }; formsChanged(); renderRules();
          }),
          h("span", { class: "spacer" }),
          h("button", { type: "button", title: "remove this check", onclick: () => {
            checks.splice(j, 1); formsChanged(); renderRules(); } }, "✕")));
      ck.append(...kindFields(rule, at("checks", j), kp("checks", j), c.kind));
      box.append(ck);
    });
    box.append(h("button", { type: "button", onclick: () => {
      checks.push({ kind: "termination" }); setAt(rule, at("checks"), checks); formsChanged(); renderRules();
    } }, "Add check"));
    out.push(box);
  } else if (kind && !(kind in DEFAULTS)) {
    out.push(h("p", { class: "help" }, `A ${kind} rule has no form here: edit it in the YAML beside. ` +
      "Its verdicts show in Try like every rule's."));
  }
  return out;
}

function scoreFields(rule, keyPath) {
  const passfail = rule.pass_score !== undefined || rule.fail_score !== undefined;
  const mode = h("select", { dataset: { path: `${keyPath}.weight` }, onchange: (e) => {
    if (e.target.value === "passfail") { delete rule.weight; rule.pass_score = 0; rule.fail_score = -0.1; }
    else { delete rule.pass_score; delete rule.fail_score; rule.weight = 1; }
    formsChanged(); renderRules();
  } }, h("option", { value: "weight", selected: !passfail }, "weight (pass = weight, fail = 0)"),
    h("option", { value: "passfail", selected: passfail }, "pass score / fail score"));
  const out = [fieldRow("scores", `${keyPath}.scoring`, mode)];
  if (passfail) {
    out.push(fieldRow("pass score", `${keyPath}.pass_score`, numberInput(rule, ["pass_score"], `${keyPath}.pass_score`)));
    out.push(fieldRow("fail score", `${keyPath}.fail_score`, numberInput(rule, ["fail_score"], `${keyPath}.fail_score`)));
  } else {
    out.push(fieldRow("weight", `${keyPath}.weight`, numberInput(rule, ["weight"], `${keyPath}.weight`), "default 1"));
  }
  return out;
}

function renderRules() {
  const box = $("#rules");
  box.replaceChildren();
  S.rules.forEach((rule, i) => {
    const keyPath = `reward.rules.${i}`;
    if (typeof rule !== "object" || rule === null) {
      box.append(h("div", { class: "rule", dataset: { path: keyPath } }, h("p", { class: "help" },
        `rule ${i + 1} is not a mapping; edit it in the YAML`)));
      return;
    }
    const kinds = Object.keys(DEFAULTS);
    if (rule.kind && !kinds.includes(rule.kind)) kinds.push(rule.kind);  // e.g. judge: shown, edited in the YAML
    const kindSelect = h("select", { class: "rule-kind", dataset: { path: `${keyPath}.kind` }, onchange: (e) => {
      const v = e.target.value;
      if (!(v in DEFAULTS)) return;
      const keep = { name: rule.name, weight: rule.weight, pass_score: rule.pass_score, fail_score: rule.fail_score };
      for (const k of Object.keys(rule)) delete rule[k];
      Object.assign(rule, Object.fromEntries(Object.entries(keep).filter(([, x]) => x !== undefined)),
        { kind: v }, DEFAULTS[v]());
      formsChanged(); renderRules();
    } }, kinds.map((k) => h("option", { value: k, selected: k === rule.kind }, k)));
    const card = h("div", { class: "rule", dataset: { path: keyPath, rule: rule.name || rule.kind || "" } },
      h("div", { class: "rule-head" },
        h("span", { class: "num" }, `${i + 1}`),
        h("input", { type: "text", class: "rule-name", value: rule.name || "", placeholder: rule.kind || "name",
          dataset: { path: `${keyPath}.name` }, title: "the rule's name (its column in the run's curves)",
          oninput: (e) => { setAt(rule, ["name"], e.target.value || undefined); formsChanged(); } }),
        h("span", { class: "spacer" }),
        h("button", { type: "button", title: "move up", disabled: i === 0, onclick: () => move(i, -1) }, "↑"),
        h("button", { type: "button", title: "move down", disabled: i === S.rules.length - 1, onclick: () => move(i, 1) }, "↓"),
        h("button", { type: "button", class: "remove-rule", title: "remove this rule", onclick: () => {
          S.rules.splice(i, 1); S.open.clear(); formsChanged(); renderRules(); } }, "Remove")),
      h("p", { class: "sentence", dataset: { index: i } }, ""),
      h("div", { class: "agreement", dataset: { index: i } }));
    // the spec's own words (kind, extract, compare, flags...) sit behind this toggle; a rule with a problem opens it
    const details = h("details", { class: "rule-details", open: S.open.has(i),
      ontoggle: (e) => { if (e.target.open) S.open.add(i); else S.open.delete(i); } },
    h("summary", {}, "details (the spec's words for this rule)"),
    fieldRow("kind", `${keyPath}.kindrow`, kindSelect, "what sort of check this is"));
    details.append(...scoreFields(rule, keyPath));
    details.append(...kindFields(rule, [], keyPath, rule.kind));
    card.append(details);
    box.append(card);
  });
  placeProblems();
}

function move(i, d) {
  const [r] = S.rules.splice(i, 1);
  S.rules.splice(i + d, 0, r);
  formsChanged(); renderRules();
}

function placeProblems() {
  document.querySelectorAll("#rules .problem").forEach((el) => el.remove());
  document.querySelectorAll("#rules .rule").forEach((el) => el.classList.remove("has-error"));
  const problems = (S.check && S.check.problems) || [];
  for (const p of problems) {
    if (!p.key_path.startsWith("reward")) continue;
    let path = p.key_path, target = null;
    while (path) {
      target = document.querySelector(`#rules .field[data-path="${CSS.escape(path)}"], #rules .group[data-path="${CSS.escape(path)}"], #rules .check[data-path="${CSS.escape(path)}"], #rules .rule[data-path="${CSS.escape(path)}"]`);
      if (target) break;
      path = path.includes(".") ? path.slice(0, path.lastIndexOf(".")) : "";
    }
    if (!target) continue;
    const msg = h("div", { class: `problem ${p.severity}`, dataset: { code: p.code } },
      `${p.code}${p.code_name ? " " + p.code_name : ""}: ${p.key_path}: ${p.message}`,
      p.hint ? h("span", { class: "hint" }, p.hint) : null);
    if (target.classList.contains("rule") || target.classList.contains("group") || target.classList.contains("check")) {
      const head = target.querySelector(":scope > .rule-head, :scope > .group-title");
      if (head) head.after(msg); else target.prepend(msg);
    } else target.append(msg);
    if (p.severity === "error") target.closest(".rule")?.classList.add("has-error");
    const details = target.closest("details.rule-details");
    if (details && p.severity === "error" && !details.open) details.open = true;  // the problem is seen where it is
  }
  placeWords();
}

// Each rule's sentence (sailrl explain's words, from the server), each pattern's words, and which labelled
// replies each rule gets right.
function placeWords() {
  const sentences = (S.check && S.check.sentences) || [];
  document.querySelectorAll("#rules p.sentence").forEach((el) => {
    const i = Number(el.dataset.index);
    const broken = S.check && S.check.broken && S.check.broken[String(i)];
    el.textContent = sentences[i] || (broken ? `(this rule has a problem: ${broken.problem})` : "(no sentence yet: finish the rule)");
    el.classList.toggle("bad", !sentences[i]);
  });
  document.querySelectorAll("#rules .pattern-words").forEach((el) => el.remove());
  for (const [path, words] of Object.entries((S.check && S.check.pattern_words) || {})) {
    const field = document.querySelector(`#rules .field[data-path="${CSS.escape(path)}"]`);
    if (field) field.append(h("span", { class: "pattern-words" }, `matches: ${words}`));
  }
  renderAgreement();
}

function renderAgreement() {
  document.querySelectorAll("#rules .agreement").forEach((el) => {
    el.replaceChildren();
    const rule = S.rules[Number(el.dataset.index)];
    const row = rule && S.agreement[rule.name];
    if (!S.labels.length || !row) return;
    const right = row.filter((x) => x === true).length, known = row.filter((x) => x !== null).length;
    el.append(h("span", { class: right === known ? "pass" : "fail" }, `gets ${right} of ${known} of your labelled replies right`),
      " ", ...row.map((x, j) => h("span", { class: `mark ${x === true ? "pass" : x === false ? "fail" : ""}`,
        title: `${S.labels[j].good ? "good" : "bad"}: ${S.labels[j].completion}` }, x === true ? "✓" : x === false ? "✗" : "?")));
  });
}

function renderProblems() {
  const list = $("#problems");
  list.replaceChildren();
  const problems = (S.check && S.check.problems) || [];
  if (!problems.length) list.append(h("li", {}, "No problems: the spec validates."));
  for (const p of problems) {
    list.append(h("li", { class: p.severity, dataset: { code: p.code } },
      h("span", { class: "mono" }, p.headline), ` [${p.code}${p.code_name ? " " + p.code_name : ""}]`,
      p.hint ? h("span", { class: "hint" }, "hint: " + p.hint) : null));
  }
  if (S.check && S.check.omitted) list.append(h("li", {}, `… and ${S.check.omitted} more (fix these first)`));
  const v = $("#validity");
  if (!S.check) { v.textContent = ""; return; }
  const errors = problems.filter((p) => p.severity === "error").length;
  const warnings = problems.length - errors;
  v.textContent = errors ? `${errors} error${errors > 1 ? "s" : ""}` : `valid${warnings ? `, ${warnings} warning${warnings > 1 ? "s" : ""}` : ""}`;
  v.className = "validity " + (errors ? "bad" : "ok");
}

function applyCheck(check, { rebuild }) {
  S.check = check;
  if (rebuild) {
    if (Array.isArray(check.rules)) {
      S.rules = JSON.parse(JSON.stringify(check.rules));
      S.examples = JSON.parse(JSON.stringify(check.examples || []));
      $("#rule-note").hidden = true;
      renderRules();
    } else if (check.rules_note) {  // a method that trains without reward rules (dpo; sft, distill may)
      S.rules = [];
      S.examples = JSON.parse(JSON.stringify(check.examples || []));
      const note = $("#rule-note");
      note.hidden = false;
      note.textContent = check.rules_note;
      renderRules();
    } else {
      const note = $("#rule-note");
      note.hidden = false;
      note.textContent = "The YAML does not parse up to reward.rules yet: fix it on the right; the forms follow.";
    }
    $(".add-rule").hidden = check.method === "dpo";  // a DPO spec with rules is an error (S257)
  } else placeProblems();
  renderProblems();
  updateDirty();
}

// ------------------------------------------------------------------------------------------ text in step

async function patchOnce() {
  try {
    const r = await api("/api/patch", { text: S.text, rules: S.rules, examples: S.examples });
    S.text = r.text;
    const yaml = $("#yaml");
    if (document.activeElement !== yaml) yaml.value = r.text;
    applyCheck(r.check, { rebuild: false });
    afterSpecChange();
  } catch (err) { status(err.message, "error"); }
}
const patchNow = latest(patchOnce);
const formsChanged = debounce(() => patchNow(), 120);

const checkNow = latest(async () => {
  try {
    const check = await api("/api/check", { text: S.text });
    applyCheck(check, { rebuild: true });
    afterSpecChange();
  } catch (err) { status(err.message, "error"); }
});
const yamlChanged = debounce(() => checkNow(), 200);

function afterSpecChange() { tryNow(); refreshExamples(); refreshLabels(); if (S.tab === "data") refreshData(); }

function updateDirty() {
  const dirty = S.text !== S.loadedText;
  const onlyExamples = !!(S.check && !S.check.valid && S.check.only_examples);
  $("#save").disabled = !dirty || !S.check || (!S.check.valid && !onlyExamples);
  $("#save").textContent = onlyExamples ? "Save (with the new scores)" : "Save";
  $("#save").title = onlyExamples ? "some examples' expected scores no longer hold: saving uses the new scores" :
    !S.check || !S.check.valid ? "the spec has errors: it is saved only when it validates" :
      dirty ? "write the spec file" : "no unsaved changes";
  if (dirty) status("unsaved changes");
  else if ($("#status").textContent === "unsaved changes") status("no unsaved changes");
}

// ------------------------------------------------------------------------------------------ try

function renderFields() {
  const box = $("#row-fields");
  box.replaceChildren();
  const names = Object.keys(S.fields);
  if (!names.length) S.fields = { answer: "" };
  for (const k of Object.keys(S.fields)) {
    box.append(h("div", { class: "field" }, h("label", {}, k), h("input", { type: "text", value: String(S.fields[k] ?? ""),
      dataset: { field: k }, oninput: (e) => { S.fields[k] = e.target.value; tryNow(); } })));
  }
  if (S.row) {
    const where = S.row.split === "skipped" ? `skipped in training: ${S.row.skip_reason}` : `${S.row.split} row`;
    box.append(h("p", { class: "help" }, `row ${S.row.index} (${where})`));
  }
}

const tryNow = latest(async () => {
  const body = { text: S.text, completion: $("#completion").value, fields: S.fields,
    truncated: $("#truncated").checked, num_tokens: $("#num-tokens").value === "" ? null : parseInt($("#num-tokens").value, 10) };
  let r;
  try { r = await api("/api/try", body); } catch (err) { status(err.message, "error"); return; }
  const tbody = $("#verdicts tbody");
  tbody.replaceChildren();
  const note = $("#try-note");
  if (!r.ok) { note.hidden = false; note.textContent = r.problem; $("#total").textContent = ""; S.lastTry = null; return; }
  const notes = [];
  if (r.reference_problem) notes.push(`reference problem: ${r.reference_problem} (training skips such rows)`);
  if (r.total_note) notes.push(r.total_note);
  note.hidden = !notes.length;
  note.textContent = notes.join("; ");
  for (const v of r.rules) {
    // a judge rule whose judge was not asked (a remote judge without --judge): neither pass nor fail
    const verdict = v.not_checked ? "not checked" : v.passed ? "pass" : "fail";
    tbody.append(h("tr", { dataset: { rule: v.name } }, h("td", {}, v.name),
      h("td", { class: v.not_checked ? "unchecked" : v.passed ? "pass" : "fail" }, verdict),
      h("td", { class: "score" }, fmt(v.score)), h("td", {}, v.why)));
  }
  $("#total").textContent = fmt(r.total);
  $("#verdicts").dataset.chars = String(body.completion.length);  // which text the table shows the verdicts of
  $("#reference").textContent = r.reference != null ? `reference answer: '${r.reference}'` : "";
  S.lastTry = { ...body, result: r };
});

function fmt(x) { return typeof x === "number" ? String(Math.round(x * 1e6) / 1e6) : "-"; }

async function chooseRow(index, random = false) {
  try {
    const r = await api("/api/row", { text: S.text, index, random });
    S.row = r;
    S.fields = { ...r.fields };
    $("#row-index").value = r.index;
    renderFields();
    showPrompt(r);
    tryNow();
  } catch (err) { status(err.message, "error"); }
}

const searchRows = debounce(async () => {
  const q = $("#row-search").value.trim();
  const list = $("#row-results");
  list.replaceChildren();
  if (!q) return;
  try {
    const r = await api("/api/rows", { text: S.text, q, limit: 8 });
    for (const row of r.rows) {
      list.append(h("li", { onclick: () => { list.replaceChildren(); $("#row-search").value = ""; chooseRow(row.index); } },
        `${row.index}: ${JSON.stringify(row.fields).slice(0, 120)}`));
    }
    if (!r.rows.length) list.append(h("li", {}, "no row matches"));
  } catch (err) { list.append(h("li", {}, err.message)); }
}, 150);

// ------------------------------------------------------------------------------------------ examples

const refreshExamples = latest(async () => {
  let r;
  try { r = await api("/api/examples", { text: S.text }); } catch (err) { return; }
  const tbody = $("#examples tbody");
  tbody.replaceChildren();
  S.exampleResults = r.examples;
  $("#use-new-scores").hidden = !r.examples.some((e) => e.passed === false);
  for (const e of r.examples) {
    const ex = e.example || {};
    const expects = [];
    if (ex.expect_total !== undefined) expects.push(`total ${ex.expect_total}`);
    for (const [k, v] of Object.entries(ex.expect || {})) expects.push(`${k} ${v}`);
    const result = e.passed === null ? h("td", {}, e.problem) :
      h("td", { class: e.passed ? "pass" : "fail" }, e.passed ? "pass" : "fail", e.misses && e.misses.length ? h("div", { class: "help" }, e.misses.join("; ")) : null);
    tbody.append(h("tr", {}, h("td", {}, String(e.index + 1)),
      h("td", { class: "mono" }, JSON.stringify(ex.completion ?? "")), h("td", {}, expects.join(", ")), result,
      h("td", {}, h("button", { type: "button", title: "remove this example", onclick: () => {
        S.examples.splice(e.index, 1); patchNow(); } }, "✕"))));
  }
  if (!r.examples.length) tbody.append(h("tr", {}, h("td", { colspan: 5, class: "help" }, "No examples yet: try a completion and click Add as example.")));
});

// Examples whose expected scores no longer hold take the scores the rules give them now (the server says what
// changes, per example; an expectation for a removed rule is dropped). A change that makes a reply the spec marks
// as failing pass (a guard) is shown and accepted only when she says so (force).
async function useNewScores(force = false) {
  let r;
  try { r = await api("/api/examples/new-scores", { text: S.text }); } catch (err) { status(err.message, "error"); return -1; }
  const list = $("#new-scores-list");
  list.replaceChildren();
  for (const c of r.changes) {
    list.append(h("li", { class: c.guard ? "fail" : "" }, `example ${c.index + 1}: ${c.words.join("; ")}`));
  }
  $("#new-scores").hidden = !r.changes.length;
  if (r.guards && !force) {
    $("#new-scores-ask").hidden = false;
    status(`${r.guards} example${r.guards === 1 ? "" : "s"} the spec marks as failing would pass with the new scores: ` +
      "accept or keep the old ones (listed under Examples)", "error");
    return -1;
  }
  $("#new-scores-ask").hidden = true;
  S.examples = r.examples;
  await patchOnce();
  const changed = r.changes.length;
  status(`${changed} example${changed === 1 ? "" : "s"} changed to the new scores (listed under Examples)`);
  return changed;
}

function addExample() {
  const t = S.lastTry;
  if (!t || !t.result || !t.result.ok) { status("try a completion first", "error"); return; }
  const expect = {};
  for (const v of t.result.rules) if (!v.not_checked) expect[v.name] = v.score;  // an unasked judge: no expectation
  const fields = {};
  for (const [k, v] of Object.entries(t.fields)) fields[k] = String(v);
  const ex = { completion: t.completion, fields };
  if (t.truncated) ex.truncated = true;
  if (t.num_tokens != null && !Number.isNaN(t.num_tokens)) ex.num_tokens = t.num_tokens;
  if (t.result.total !== null && t.result.total !== undefined) ex.expect_total = t.result.total;
  ex.expect = expect;
  S.examples.push(ex);
  patchNow();
  status("example added: save to keep it");
}

// ------------------------------------------------------------------------------------------ data

async function refreshData() {
  if (!$("#preflight-verdict").textContent) $("#preflight-verdict").textContent = "checking the data and prompts (preflight)…";
  try {
    const p = await api("/api/preflight", { text: S.text });
    $("#preflight-verdict").textContent = p.verdict || "";
    const list = $("#preflight-problems");
    list.replaceChildren();
    for (const pr of p.problems || []) list.append(h("li", { class: pr.severity }, pr.message, pr.fix ? h("span", { class: "hint" }, "what to do: " + pr.fix) : null));
    const d = p.data || {};
    const tk = p.tokens;
    $("#data-summary").textContent = d.error ? d.error :
      `${d.source}: ${d.loaded} rows loaded, ${d.selected} selected, ${d.train} for training, ${d.eval} for evaluation` +
      (tk ? `; ${tk.what || "prompt tokens"} min ${tk.min} / median ${tk.median} / max ${tk.max}` +
        (tk.context ? ` (context ${tk.context}` + (tk.max_tokens != null ? `, max_tokens ${tk.max_tokens})` : ")") : "") : "");
  } catch (err) {
    $("#preflight-verdict").textContent = err.message;
    $("#preflight-problems").replaceChildren();
    $("#data-summary").textContent = "";
  }
  await refreshRowsTable();
}

async function refreshRowsTable() {
  const table = $("#data-rows");
  if (!table.tBodies[0].rows.length) table.tBodies[0].replaceChildren(h("tr", {}, h("td", { class: "help" }, "reading the dataset…")));
  try {
    const r = await api("/api/rows", { text: S.text, q: $("#data-search").value, offset: S.dataOffset, limit: 20 });
    const cols = r.columns.length ? r.columns : Object.keys((r.rows[0] || {}).fields || {});
    const fieldNames = Array.from(new Set(r.rows.flatMap((x) => Object.keys(x.fields))));
    table.tHead.replaceChildren(h("tr", {}, h("th", {}, "row"), fieldNames.map((c) => h("th", {}, c)), h("th", {}, "use")));
    table.tBodies[0].replaceChildren(...r.rows.map((row) => h("tr", {
      class: (row.split === "skipped" ? "skipped " : "") + (S.row && S.row.index === row.index ? "chosen" : ""),
      dataset: { index: row.index }, onclick: () => chooseRow(row.index).then(refreshRowsTable) },
    h("td", {}, String(row.index)), fieldNames.map((c) => h("td", {}, String(row.fields[c] ?? ""))),
    h("td", {}, row.split === "skipped" ? `skipped: ${row.skip_reason}` : row.split))));
    $("#data-page").textContent = ` ${r.total ? r.offset + 1 : 0}–${r.offset + r.rows.length} of ${r.total} `;
    void cols;
  } catch (err) {
    table.tHead.replaceChildren();
    table.tBodies[0].replaceChildren(h("tr", {}, h("td", {}, err.message)));
  }
}

// A DPO row: its prompt, then the chosen and the rejected reply, each under its own heading.
function showPair(box, pair) {
  box.replaceChildren(
    h("span", { class: "pair-part" }, "prompt"), "\n", pair.prompt, "\n",
    h("span", { class: "pair-part chosen" }, `chosen (${pair.chosen_field})` +
      (pair.chosen_tokens != null ? `, ${pair.chosen_tokens} tokens` : "")), "\n", pair.chosen, "\n",
    h("span", { class: "pair-part rejected" }, `rejected (${pair.rejected_field})` +
      (pair.rejected_tokens != null ? `, ${pair.rejected_tokens} tokens` : "")), "\n", pair.rejected);
}

function showPrompt(r) {
  $("#prompt-index").textContent = String(r.index);
  $("#prompt-what").textContent = r.pair ? "Pair" : r.conversation ? "Conversation" : "Prompt";
  const box = $("#prompt-text");
  if (r.pair && !r.prompt_error) showPair(box, r.pair);
  else box.textContent = r.prompt_error ? r.prompt_error : (r.prompt ?? "");
  const bits = [];
  if (r.tokens != null) bits.push(`${r.tokens} tokens` + (r.pair ? " (chosen + rejected)" : ""));
  if (r.trained_tokens != null) bits.push(`${r.trained_tokens} trained (the assistant turns)`);
  if (r.tool_problem) bits.push(r.tool_problem);
  if (r.reference != null) bits.push(`reference answer '${r.reference}'`);
  if (r.skip_reason) bits.push(`skipped in training: ${r.skip_reason}`);
  $("#prompt-meta").textContent = bits.join(" · ");
}

// ------------------------------------------------------------------------------------------ runs

// A run of another method draws its own metric (the key that marks it) on top, its held-out points, and its
// fractions below, as `sailrl plot` does: [marker key, top title, top series, eval points, fractions].
const METHOD_CURVES = [
  ["train/nll", "NLL per step (nats per assistant token)", [["train/nll", "train NLL"]], [["eval/nll", "eval NLL"]],
    [["eval/correct", "eval correct"]]],
  ["dpo/loss", "DPO loss and margin per step", [["dpo/loss", "train loss"], ["dpo/margin", "margin"]],
    [["eval/loss", "eval loss"]], [["dpo/accuracy", "accuracy"], ["eval/accuracy", "eval accuracy"]]],
  ["distill/reverse_kl", "reverse KL to the teacher, and reward, per step",
    [["distill/reverse_kl", "KL(student || teacher)"], ["reward/total", "reward total"]], [],
    [["correct", "correct (pass rate)"], ["frac_truncated", "truncated"]]],
];

const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf", "#d62728"];

function drawCurves() {
  const box = $("#curves");
  box.replaceChildren();
  const m = S.runMetrics.filter((x) => Number.isInteger(x.step));
  if (!m.length) { box.append(h("p", { class: "help" }, "No steps in metrics.jsonl yet.")); return; }
  const keys = new Set();
  m.forEach((x) => Object.keys(x).forEach((k) => keys.add(k)));
  const ruleKeys = [...keys].filter((k) => k.startsWith("reward/") && k !== "reward/total" && typeof m.find((x) => k in x)[k] === "number");
  const top = [["reward/total", "total"], ...ruleKeys.map((k) => [k, `rule ${k.slice(7)}`]), ["correct", "correct (pass rate)"]].filter(([k]) => keys.has(k));
  const bottom = [["degenerate_frac", "degenerate groups"], ["frac_truncated", "truncated"]].filter(([k]) => keys.has(k));
  let evalKey = keys.has("eval/reward/total") ? "eval/reward/total" : null;
  let topTitle = "reward per step";
  const method = METHOD_CURVES.find(([k]) => keys.has(k));
  if (method) {  // an SFT, DPO or distillation run
    top.splice(0, top.length, ...method[2].filter(([k]) => keys.has(k)));
    bottom.splice(0, bottom.length, ...method[4].filter(([k]) => keys.has(k)));
    const ev = method[3].find(([k]) => keys.has(k));
    evalKey = ev ? ev[0] : null;
    topTitle = method[1];
  }
  const W = 1000, H1 = 260, H2 = 120, L = 50, R = 10, GAP = 30;
  const steps = m.map((x) => x.step);
  const x0 = Math.min(...steps), x1 = Math.max(...steps);
  const sx = (s) => L + (x1 === x0 ? 0.5 : (s - x0) / (x1 - x0)) * (W - L - R);
  const NS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H1 + H2 + GAP + 30}`);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", "reward and fractions per step");
  const el = (tag, attrs, text) => { const e = document.createElementNS(NS, tag); for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v); if (text !== undefined) e.textContent = text; svg.append(e); return e; };
  const legend = h("div", { class: "legend" });
  const panel = (series, y0, hgt, lo, hi, title) => {
    const sy = (v) => y0 + hgt - ((v - lo) / (hi - lo || 1)) * hgt;
    el("rect", { x: L, y: y0, width: W - L - R, height: hgt, fill: "none", stroke: "#d5dbe2" });
    for (const v of [lo, (lo + hi) / 2, hi]) {
      el("line", { x1: L, x2: W - R, y1: sy(v), y2: sy(v), stroke: "#eef0f3" });
      el("text", { x: L - 6, y: sy(v) + 4, "text-anchor": "end", "font-size": 11, fill: "#5b6673" }, String(Math.round(v * 100) / 100));
    }
    el("text", { x: L + 4, y: y0 + 14, "font-size": 12, fill: "#5b6673" }, title);
    series.forEach(([key, label, color, pointsOnly]) => {
      const pts = m.filter((x) => typeof x[key] === "number" && Number.isFinite(x[key])).map((x) => [sx(x.step), sy(x[key])]);
      if (!pts.length) return;
      if (pointsOnly || pts.length === 1) {
        pts.forEach(([px, py]) => el("path", { d: `M${px} ${py - 6}L${px + 6} ${py}L${px} ${py + 6}L${px - 6} ${py}Z`, fill: "none", stroke: color, "stroke-width": 2, class: "point" }));
      }
      if (!pointsOnly) el("polyline", { points: pts.map((p) => p.join(",")).join(" "), fill: "none", stroke: color, "stroke-width": key === "reward/total" ? 3 : 1.6, class: "series", "data-key": key });
      // the colour through the CSSOM: the page's CSP (style-src 'self') refuses a style attribute
      const swatch = h("span", {}, label);
      swatch.style.setProperty("--c", color);
      legend.append(swatch);
    });
  };
  const vals = top.flatMap(([k]) => m.map((x) => x[k]).filter((v) => typeof v === "number" && Number.isFinite(v)));
  if (evalKey) vals.push(...m.map((x) => x[evalKey]).filter((v) => typeof v === "number"));
  const lo = Math.min(0, ...vals), hi = Math.max(1, ...vals);
  const topSeries = top.map(([k, label], i) => [k, label, PALETTE[i % PALETTE.length], false]);
  if (evalKey) topSeries.push([evalKey, method ? `${evalKey} (held-out)` : "eval total", "#d62728", true]);
  panel(topSeries, 10, H1, lo, hi, topTitle);
  panel(bottom.map(([k, label], i) => [k, label, ["#6b7280", "#b45309"][i], false]), 10 + H1 + GAP, H2, 0, 1, "fractions");
  const yAxis = 10 + H1 + GAP + H2;
  const tickEvery = Math.max(1, Math.ceil((x1 - x0 + 1) / 10));
  for (let s = x0; s <= x1; s += tickEvery) el("text", { x: sx(s), y: yAxis + 16, "text-anchor": "middle", "font-size": 11, fill: "#5b6673" }, String(s));
  el("text", { x: W / 2, y: yAxis + 29, "text-anchor": "middle", "font-size": 11, fill: "#5b6673" }, "step");
  box.append(svg, legend);
}

async function loadRuns() {
  const sel = $("#run-select");
  try {
    const r = await api("/api/runs", { text: S.text });
    const current = S.run;
    sel.replaceChildren(...r.runs.map((x) => h("option", { value: x.id, selected: x.id === current }, `${x.name} (${x.id === "@run" ? x.path : x.id})`)));
    if (!r.runs.length) { sel.append(h("option", { value: "" }, "(no runs yet: start one above)")); return; }
    if (!current || !r.runs.some((x) => x.id === current)) await openRun(r.runs[0].id);
  } catch (err) { status(err.message, "error"); }
}

async function openRun(id) {
  S.run = id; S.runMetrics = []; S.runNext = 0; S.runFile = null; S.runSteps = { train: [], eval: [] }; S.records = [];
  $("#run-select").value = id;
  await pollRun(true);
  await pollStatus();
}

async function pollRun(first = false) {
  if (!S.run) return;
  try {
    // after: a byte offset into metrics.jsonl, so each poll reads only what was appended (at most a few MiB;
    // "more" says to ask again at once); "reset": the file was replaced or cut, read again from its start
    let changed = first;
    for (let i = 0; i < 64; i++) {
      const m = await api(`/api/run/metrics?run=${encodeURIComponent(S.run)}&after=${S.runNext}` +
        (S.runFile ? `&file=${encodeURIComponent(S.runFile)}` : ""));
      if (m.reset) { S.runMetrics = []; changed = true; }
      if (m.lines.length) { S.runMetrics.push(...m.lines); changed = true; }
      S.runNext = m.next; S.runFile = m.file;
      if (!m.more) break;
    }
    if (changed) drawCurves();
    const steps = await api(`/api/run/steps?run=${encodeURIComponent(S.run)}`);
    const kind = $("#kind-select").value;
    const before = S.runSteps[kind] || [];
    S.runSteps = steps;
    const now = steps[kind] || [];
    const sel = $("#step-select");
    const following = first || !sel.value || Number(sel.value) === before[before.length - 1];
    if (first || now.length !== before.length) {
      const keep = sel.value;
      sel.replaceChildren(...now.map((s) => h("option", { value: s }, `step ${s}`)));
      if (following && now.length) { sel.value = String(now[now.length - 1]); await loadRollouts(); }
      else if (keep) sel.value = keep;
    }
    const last = S.runMetrics.length ? S.runMetrics[S.runMetrics.length - 1].step : null;
    $("#run-follow").textContent = `following: ${S.runMetrics.length} steps in metrics.jsonl` + (last != null ? `, last step ${last}` : "") +
      `; rollouts logged for ${now.length} ${kind} steps`;
  } catch (err) { $("#run-follow").textContent = err.message; }
}

async function loadRollouts() {
  const step = $("#step-select").value;
  if (!S.run || step === "") { S.records = []; renderRollouts(); return; }
  try {
    const r = await api(`/api/run/rollouts?run=${encodeURIComponent(S.run)}&step=${step}&kind=${$("#kind-select").value}`);
    S.records = r.records;
  } catch (err) { S.records = []; status(err.message, "error"); }
  const names = Array.from(new Set(S.records.flatMap((x) => Object.keys(x.rules || {}))));
  const rf = $("#rule-filter");
  const keep = rf.value;
  rf.replaceChildren(h("option", { value: "" }, "(any)"), ...names.map((n) => h("option", { value: n }, n)));
  if (names.includes(keep)) rf.value = keep;
  const pick = $("#pick-rollout");
  pick.replaceChildren(h("option", { value: "" }, `(pick a rollout of step ${step})`),
    ...S.records.slice(0, 100).map((x, i) => h("option", { value: i }, `${fmt(x.total)} · ${String(x.completion).slice(0, 50)}`)));
  renderRollouts();
}

// Why an episode ended (rollouts.jsonl episode.end; sailrl.runtime.rollouts.episode.END_REASONS), in plain words.
const END_WORDS = {
  answered: "the model answered (a reply without tool calls, and no feedback rule failed)",
  max_turns: "it reached environment.max_turns",
  max_tool_calls: "it reached environment.max_tool_calls",
  max_tokens: "a reply was cut off at sampling.max_tokens",
  max_episode_tokens: "the next turn would not fit in the episode's token budget (max_episode_tokens)",
  parse_error: "a reply could not be parsed (its tool calls were not well formed)",
};

// Every turn of an episode (rollouts.jsonl episode.turns): assistant text and its tool calls, tool results (errors
// marked), feedback turns; then why it ended. All of it is model or tool text: textContent only.
function episodeView(ep) {
  const turns = (ep.turns || []).filter((t) => t && typeof t === "object");
  const box = h("div", { class: "turns" });
  turns.forEach((t, i) => {
    const n = i + 1, role = String(t.role ?? "");
    let label, kind;
    if (role === "assistant") { label = `turn ${n} · assistant`; kind = "assistant"; }
    else if (role === "tool") { label = `turn ${n} · tool ${t.name ?? ""}` + (t.error ? " · error" : ""); kind = t.error ? "tool error" : "tool"; }
    else if (role === "user") { label = `turn ${n} · feedback`; kind = "feedback"; }
    else { label = `turn ${n} · ${role}`; kind = "note"; }
    const calls = Array.isArray(t.tool_calls) && t.tool_calls.length ?
      h("ul", { class: "tool-calls" }, t.tool_calls.map((c) => h("li", { class: "tool-call" }, "→ tool call ",
        h("code", { class: "call-name" }, String(c.name ?? "")), h("code", { class: "call-args" }, `(${c.arguments ?? ""})`)))) : null;
    const text = String(t.text ?? "");
    box.append(h("div", { class: `turn ${kind}`, dataset: { role, turn: n } },
      h("div", { class: "turn-head" }, label),
      text ? h("pre", { class: "text turn-text" }, text) : h("div", { class: "help turn-text" }, "(empty)"),
      calls));
  });
  const end = String(ep.end ?? "");
  const replies = turns.filter((t) => t.role === "assistant").length;  // what environment.max_turns counts
  box.append(h("div", { class: "episode-end" }, `episode ended: ${end || "?"} after ${replies} model turn${replies === 1 ? "" : "s"}`,
    END_WORDS[end] ? ` (${END_WORDS[end]})` : ""));
  return box;
}

function episodeSummary(ep) {
  const turns = (ep.turns || []).filter((t) => t && typeof t === "object");
  const calls = turns.reduce((k, t) => k + (Array.isArray(t.tool_calls) ? t.tool_calls.length : 0), 0);
  const errors = turns.filter((t) => t.role === "tool" && t.error).length;
  const feedback = turns.filter((t) => t.role === "user").length;
  return `episode: ${turns.filter((t) => t.role === "assistant").length} replies, ${calls} tool call${calls === 1 ? "" : "s"}` +
    (errors ? ` (${errors} failed)` : "") + (feedback ? `, ${feedback} feedback` : "") + ` · ended: ${ep.end ?? "?"}`;
}

function episodeText(ep) {
  return (ep.turns || []).map((t) => [t && t.text, ...((t && t.tool_calls) || []).map((c) => `${c.name} ${c.arguments}`)].join("\n")).join("\n");
}

// What the rules read in an episode: its final reply, or (environment.score: all_turns) every reply joined.
function scoredLabel(x) {
  const replies = (x.episode.turns || []).filter((t) => t && t.role === "assistant");
  const last = replies.length ? String(replies[replies.length - 1].text ?? "") : null;
  return (last !== null && last.trim() === String(x.completion ?? "").trim()) ?
    "scored text: the final reply (the rules' verdicts below are on it)" :
    "scored text: the episode's replies (the rules' verdicts below are on it)";
}

function renderRollouts() {
  const box = $("#rollouts");
  box.replaceChildren();
  const rule = $("#rule-filter").value, verdict = $("#verdict-filter").value;
  const q = $("#rollout-search").value.trim().toLowerCase();
  const order = $("#order-select").value;
  let recs = S.records.slice();
  if (rule && verdict) recs = recs.filter((x) => ((x.rules || {})[rule] || {}).passed === (verdict === "pass"));
  if (q) recs = recs.filter((x) => `${x.completion}\n${x.prompt}\n${x.reference}\n${x.episode ? episodeText(x.episode) : ""}`.toLowerCase().includes(q));
  if (order !== "logged") {
    const val = (x) => { const v = rule ? ((x.rules || {})[rule] || {}).score : x.total; return typeof v === "number" ? v : null; };
    const known = recs.filter((x) => val(x) !== null), unknown = recs.filter((x) => val(x) === null);
    known.sort((a, b) => (order === "best" ? val(b) - val(a) : val(a) - val(b)));
    recs = known.concat(unknown);
  }
  $("#rollout-count").textContent = `${recs.length} of ${S.records.length} rollouts`;
  for (const x of recs.slice(0, 200)) {
    const verdicts = h("table", { class: "verdicts" }, h("thead", {}, h("tr", {}, h("th", {}, "rule"), h("th", {}, "result"), h("th", {}, "score"), h("th", {}, "why"))),
      h("tbody", {}, Object.entries(x.rules || {}).map(([n, v]) => h("tr", {}, h("td", {}, n),
        h("td", { class: v.passed === true ? "pass" : v.passed === false ? "fail" : "" }, v.passed === true ? "pass" : v.passed === false ? "fail" : "-"),
        h("td", {}, fmt(v.score)), h("td", {}, v.why ?? "",
          // a judge rule: the judge's own answer and the <score> taken from it (rollouts.jsonl rules.<name>.judge)
          v.judge != null ? h("details", { class: "judge" }, h("summary", {},
            v.judge_score ? `judge: score taken <score>${v.judge_score}</score>` : "judge: no score read"),
            h("pre", {}, v.judge)) : null)))));
    box.append(h("div", { class: "rollout", dataset: { group: x.group, sample: x.sample } },
      h("div", { class: "rollout-head" },
        h("span", { class: "total" }, `total ${fmt(x.total)}`),
        h("span", {}, `advantage ${fmt(x.advantage)}`),
        h("span", {}, `group ${x.group} · sample ${x.sample} · row ${x.row ?? "-"}`),
        x.truncated ? h("span", { class: "fail" }, "cut off at max_tokens") : null,
        x.degenerate ? h("span", {}, "degenerate group") : null,
        x.episode ? h("span", { class: "episode-summary" }, episodeSummary(x.episode)) : null,
        h("span", { class: "mono" }, `sampler checkpoint ${x.sampler_path ?? "-"} (policy step ${x.sampler_step ?? "-"}, staleness ${x.staleness ?? "-"})`),
        h("button", { type: "button", onclick: () => tryRecord(x) }, "Try it"),
        h("button", { type: "button", class: "label-good", onclick: () => addLabel(x.completion, x.fields || (x.reference != null ? { answer: x.reference } : {}), x.truncated, true) }, "Good"),
        h("button", { type: "button", class: "label-bad", onclick: () => addLabel(x.completion, x.fields || (x.reference != null ? { answer: x.reference } : {}), x.truncated, false) }, "Bad")),
      h("details", {}, h("summary", {}, "prompt"), h("pre", { class: "text" }, x.prompt ?? "")),
      x.episode ? episodeView(x.episode) : null,
      x.episode ? h("div", { class: "scored-label" }, scoredLabel(x)) : null,
      h("pre", { class: "text completion" }, x.completion ?? ""),
      x.reference != null ? h("div", { class: "help" }, `reference: ${x.reference}`) : null,
      verdicts));
  }
}

function tryRecord(x) {
  $("#completion").value = x.completion ?? "";
  $("#truncated").checked = !!x.truncated;
  $("#num-tokens").value = x.num_tokens ?? "";
  if (x.row != null) chooseRow(x.row);
  else tryNow();
  switchTab("rules");
}

// ------------------------------------------------------------------------------------------ load, save, reload

async function loadSpec(note) {
  const r = await api("/api/spec");
  $("#file").textContent = r.path;
  if (r.read_problems.length) { banner(r.read_problems.map((p) => p.headline).join("; "), "error"); return; }
  S.text = r.text; S.loadedText = r.text; S.baseSha = r.disk_sha;
  $("#yaml").value = r.text;
  applyCheck(r.check, { rebuild: true });
  if (note) banner(note);
  if (!S.row) {
    try {
      const rows = await api("/api/rows", { text: S.text, limit: 1 });
      if (rows.rows.length) await chooseRow(rows.rows[0].index);
    } catch (err) { renderFields(); }
  }
  afterSpecChange();
  status(r.check.valid ? "loaded" : "loaded: the spec has problems (listed under the YAML)");
}

async function save() {
  if (S.check && !S.check.valid && S.check.only_examples) {
    if (await useNewScores() < 0) return;  // a guard would pass: she accepts (or not) under Examples first
    const check = await api("/api/check", { text: S.text });
    applyCheck(check, { rebuild: false });
    if (!check.valid) { status("the spec still has problems: see the list under the YAML", "error"); return; }
  }
  try {
    const r = await api("/api/save", { text: S.text, base_sha: S.baseSha });
    S.loadedText = S.text; S.baseSha = r.disk_sha;
    updateDirty();
    banner("");
    status(r.backup ? `saved (the previous file is kept as ${r.backup})` : "saved (a new file: there was none to back up)", "ok");
  } catch (err) {
    if (err.status === 409) banner(err.message, "error", { label: "Reload from disk (drops your edits)", run: () => loadSpec("reloaded from disk") });
    else status(err.message, "error");
  }
}

async function watchDisk() {
  try {
    const r = await api("/api/disk");
    if (r.disk_sha && S.baseSha && r.disk_sha !== S.baseSha && r.disk_sha !== S.diskNotice) {
      if (S.text === S.loadedText) await loadSpec("reloaded: the file changed on disk");
      else {
        S.diskNotice = r.disk_sha;
        banner("The file changed on disk. Save will not overwrite it.", "error", { label: "Reload from disk (drops your edits)", run: () => loadSpec("reloaded from disk") });
      }
    }
  } catch { /* the server stopped: the next poll says so */ }
}


// ------------------------------------------------------------------------------------------ labels and proposals

const LABELS_KEY = () => `sailrl-studio-labels:${$("#file").textContent}`;

function saveLabels() { try { localStorage.setItem(LABELS_KEY(), JSON.stringify(S.labels)); } catch { /* full: kept in the page */ } }
function loadLabels() { try { S.labels = JSON.parse(localStorage.getItem(LABELS_KEY()) || "[]"); } catch { S.labels = []; } }

function addLabel(completion, fields, truncated, good) {
  const f = {};
  for (const [k, v] of Object.entries(fields || {})) f[k] = String(v ?? "");
  S.labels.push({ completion: String(completion ?? ""), fields: f, truncated: !!truncated, good });
  saveLabels(); renderLabels(); refreshLabels();
  status(`labelled ${good ? "good" : "bad"}: ${S.labels.length} labelled replies`);
}

function renderLabels() {
  const list = $("#labels");
  list.replaceChildren();
  if (!S.labels.length) list.append(h("li", { class: "help" }, "No labelled replies yet: type one above and press Good or Bad, or label a run's rollouts."));
  S.labels.forEach((x, i) => list.append(h("li", { class: x.good ? "good" : "bad", dataset: { index: i } },
    h("span", { class: x.good ? "pass" : "fail" }, x.good ? "good" : "bad"), " ",
    h("code", {}, JSON.stringify(x.completion)), x.truncated ? h("span", { class: "help" }, " (cut off)") : null,
    " ", h("button", { type: "button", title: "remove this label", onclick: () => { S.labels.splice(i, 1); saveLabels(); renderLabels(); refreshLabels(); } }, "✕"))));
}

const refreshLabels = latest(async () => {
  if (!S.labels.length) { S.agreement = {}; S.proposals = []; renderAgreement(); renderProposals(); return; }
  try {
    const r = await api("/api/labels", { text: S.text, labels: S.labels });
    S.agreement = r.rules; S.proposals = r.proposals;
  } catch (err) { S.agreement = {}; S.proposals = []; status(err.message, "error"); }
  renderAgreement(); renderProposals();
});

function renderProposals() {
  const box = $("#proposals");
  box.replaceChildren();
  if (!S.labels.length) return;
  if (!S.proposals.length) {
    box.append(h("p", { class: "help" }, S.labels.some((x) => x.good) && S.labels.some((x) => !x.good) ?
      "No simple rule gets all your labels right without also passing a gamed reply: label more replies, or edit a rule." :
      "Label at least one good and one bad reply: rules that tell them apart are proposed here."));
    return;
  }
  for (const p of S.proposals) {
    const what = p.replaces === null ? "Add a rule" : `Change rule ${p.replaces + 1} (${S.rules[p.replaces]?.name ?? ""}): ${p.how}`;
    box.append(h("div", { class: "proposal" }, h("div", { class: "help" }, what),
      h("p", { class: "sentence" }, p.sentence || JSON.stringify(p.rule)),
      h("div", { class: "help" }, `gets all ${S.labels.length} labelled replies right; passes none of ${p.probes} gaming probes`),
      h("button", { type: "button", class: "accept", onclick: () => {
        if (p.replaces === null) S.rules.push(p.rule); else S.rules[p.replaces] = p.rule;
        renderRules(); formsChanged(); status("rule accepted: save to keep it");
      } }, "Accept")));
  }
}

async function loadStarters() {
  try { S.starters = (await api("/api/starters")).starters; } catch { S.starters = []; }
  const sel = $("#new-kind");
  sel.replaceChildren(h("optgroup", { label: "in words" }, S.starters.map((x) => h("option", { value: `starter:${x.id}` }, x.sentence))),
    h("optgroup", { label: "by kind (the spec's words)" }, Object.keys(DEFAULTS).map((k) => h("option", { value: k }, k))));
  starterChanged();
}

function starterChanged() {
  const v = $("#new-kind").value;
  const st = S.starters.find((x) => `starter:${x.id}` === v);
  const ask = $("#new-ask");
  ask.hidden = !(st && st.ask);
  ask.placeholder = st && st.ask ? st.ask : "";
  $("#new-ask-problem").hidden = true;
}

function addRule() {
  const v = $("#new-kind").value;
  const names = new Set(S.rules.map((r) => r.name || r.kind));
  const st = S.starters.find((x) => `starter:${x.id}` === v);
  let rule;
  if (st) {
    rule = JSON.parse(JSON.stringify(st.rule));
    const said = $("#new-ask").value;
    const problem = $("#new-ask-problem");
    if (st.id === "contains" && said === "") {  // an empty text is in every reply: the rule would pass everything
      problem.hidden = false;
      problem.textContent = "type the text the reply must contain: an empty text is in every reply, so the rule " +
        "would pass everything";
      $("#new-ask").focus();
      return;
    }
    problem.hidden = true;
    if (st.id === "contains") rule.pattern = escapeRegex(said);
    if (st.id === "max_words") rule.pattern = rule.pattern.replace("N", String(Math.max(1, parseInt(said, 10) || 50)));
    if (st.id === "judge") rule.rubric = said || "The reply is correct and polite.";
  } else rule = { kind: v, ...DEFAULTS[v]() };
  const base = st ? { last_number: "answer", contains: "contains", max_words: "short", ends: "ends", judge: "judge" }[st.id] : v;
  let name = base, n = 2;
  while (names.has(name)) name = `${base}_${n++}`;
  S.rules.push({ name, ...rule, weight: 1 });
  $("#new-ask").value = "";
  renderRules(); formsChanged();
}

// ------------------------------------------------------------------------------------------ runs from the page

function overrides() {
  const out = {};
  const steps = $("#run-steps").value;
  if (steps !== "") out["training.steps"] = Number(steps);
  return out;
}

async function planRun() {
  const box = $("#run-plan");
  box.replaceChildren(h("p", { class: "help" }, "checking the data, the prompts and the cost (preflight)…"));
  try {
    const p = await api("/api/run/plan", { text: S.text, overrides: overrides() });
    box.replaceChildren(
      p.verdict ? h("p", { class: "verdict" }, `preflight: ${p.verdict}`) : null,  // never a literal "null"
      h("ul", { class: "problems" }, (p.problems || []).map((x) => h("li", { class: x.severity }, x.message))),
      h("pre", { class: "text cost" }, (p.cost || []).filter((x) => x != null).join("\n")),
      p.needs_save ? h("p", { class: "fail" }, "Save the spec first: a run trains the spec file as saved.") : null,
      h("div", { class: "run-buttons" },
        h("button", { type: "button", id: "run-start", disabled: p.needs_save || p.running, onclick: () => startRun("new") },
          p.resumable ? "Start over (the run folder's records are replaced)" : "Start the run"),
        p.resumable ? h("button", { type: "button", id: "run-resume", disabled: p.needs_save || p.running, onclick: () => startRun("resume") }, "Resume") : null));
  } catch (err) { box.replaceChildren(h("p", { class: "fail" }, err.message)); }
}

async function startRun(mode) {
  try {
    const r = await api("/api/run/start", { text: S.text, mode, overrides: overrides() });
    $("#run-plan").replaceChildren(h("p", { class: "help" }, `started (process ${r.pid}); its output goes to ${r.log}. It goes on if you close this tab.`));
    await loadRuns();
    await openRun(r.run);
    await pollStatus();
  } catch (err) { status(err.message, "error"); $("#run-plan").append(h("p", { class: "fail" }, err.message)); }
}

async function stopRun() {
  try { await api("/api/run/stop", { run: S.run }); status("stopping: the run saves its state (as Ctrl-C); Resume continues it"); }
  catch (err) { status(err.message, "error"); }
}

function seconds(x) {
  if (x == null) return "";
  const s = Math.round(x);
  return s >= 60 ? `${Math.floor(s / 60)} min ${s % 60} s` : `${s} s`;
}

async function pollStatus() {
  if (!S.run) return;
  let st;
  try { st = await api(`/api/run/status?run=${encodeURIComponent(S.run)}`); } catch { return; }
  const was = S.runStatus;
  S.runStatus = st;
  if (was && was.run === st.run && was.running && !st.running) {  // it has ended: Resume / Start over again
    status(st.exit_code === 130 ? "stopped: the run saved its state (Resume continues it)" :
      st.exit_code ? `the run ended with exit code ${st.exit_code}` : "the run finished");
    if ($("#run-plan").childElementCount) planRun();
  }
  const pr = st.progress;
  const bar = $("#run-progress");
  bar.max = pr.total || 1; bar.value = pr.done;
  $("#run-progress-text").textContent = (pr.total ? `step ${pr.done} of ${pr.total}` : `step ${pr.done}`) +
    (st.running ? (pr.seconds_left != null ? `, about ${seconds(pr.seconds_left)} left` : ", running") :
      st.exit_code === 130 ? ", stopped (state saved: Resume continues it)" : st.exit_code != null && st.exit_code !== 0 ? `, ended with exit code ${st.exit_code}` : ", not running") +
    (st.running && !st.started_here ? " (started elsewhere)" : "");
  $("#run-stop").hidden = !st.alive;
  $("#run-outcome").textContent = st.outcome ? st.outcome.charAt(0).toUpperCase() + st.outcome.slice(1) + "." : "";
  $("#run-log").textContent = st.log;
  const box = $("#gaming");
  box.replaceChildren();
  for (const g of st.gaming) {
    const idx = S.rules.findIndex((r) => r.name === g.rule);
    if ((g.signs || []).includes("never_passed")) {  // a goal not reached: the warning says what to try
      box.append(h("div", { class: "gaming never", dataset: { rule: g.rule } },
        h("strong", {}, `Rule '${g.rule}' passed on no reply (step ${g.step})`), h("p", {}, g.message)));
      continue;
    }
    box.append(h("div", { class: "gaming", dataset: { rule: g.rule } },
      h("strong", {}, `Rule '${g.rule}' looks gamed (step ${g.step})`),
      h("p", {}, g.message),
      h("div", { class: "help" }, "replies that pass it:"),
      ...g.examples.map((t) => h("pre", { class: "text" }, t)),
      h("p", {}, `Proposed fix: ${g.fix.words}.`),
      g.fix.rule ? h("button", { type: "button", class: "apply-fix", onclick: () => {
        if (idx >= 0 && g.fix.rule.name === g.rule) S.rules[idx] = g.fix.rule; else S.rules.push(g.fix.rule);
        renderRules(); formsChanged(); switchTab("rules"); status("fix applied to the rules: save, then start the run again");
      } }, "Apply the fix") : null));
  }
  $("#take-away").hidden = st.running || pr.done === 0;
}

async function sampleModel() {
  const out = $("#sample-out");
  out.replaceChildren(h("p", { class: "help" }, "sampling the trained model…"));
  const fields = {};
  document.querySelectorAll("#sample-fields input").forEach((el) => { if (el.value !== "") fields[el.dataset.field] = el.value; });
  try {
    const r = await api("/api/run/sample", { run: S.run, fields, n: 4 });
    out.replaceChildren(h("p", { class: "help" }, `prompt: ${r.prompt}` + (r.reference != null ? ` · right answer: ${r.reference}` : "")),
      ...r.samples.map((x) => h("div", { class: "sample" }, h("pre", { class: "text completion" }, x.text),
        h("div", {}, `total ${fmt(x.total)}`, x.truncated ? h("span", { class: "fail" }, " · cut off") : null),
        h("ul", { class: "sample-rules" }, x.rules.map((v) => h("li", {}, h("span", { class: v.passed ? "pass" : "fail" }, v.passed ? "pass" : "fail"), ` ${v.name}: ${v.why}`))))));
  } catch (err) { out.replaceChildren(h("p", { class: "fail" }, err.message)); }
}

async function exportModel() {
  const out = $("#export-out");
  const fmtName = $("#export-format").value;
  out.replaceChildren(h("p", { class: "help" }, "exporting…"));
  try {
    const r = await api("/api/run/export", { run: S.run, format: fmtName });
    out.replaceChildren(h("p", {}, `written to ${r.folder}: ${r.files.join(", ")}`),
      h("a", { id: "download", href: `/api/run/download?run=${encodeURIComponent(S.run)}&format=${fmtName}`, download: `${r.name}.zip` },
        "Download the model (zip, with its model card)"));
  } catch (err) { out.replaceChildren(h("p", { class: "fail" }, err.message)); }
}

function renderSampleFields() {
  const box = $("#sample-fields");
  if (box.children.length) return;
  const names = Object.keys(S.fields).length ? Object.keys(S.fields) : ["question", "answer"];
  for (const k of names) box.append(h("label", {}, `${k} `, h("input", { type: "text", dataset: { field: k } })));
}

function switchTab(tab) {
  S.tab = tab;
  document.querySelectorAll("nav .tab").forEach((b) => b.classList.toggle("active", b.dataset.tab === tab));
  document.querySelectorAll(".tabpanel").forEach((p) => { p.hidden = p.id !== `tab-${tab}`; });
  if (tab === "data") refreshData();
  if (tab === "runs") { loadRuns(); renderSampleFields(); }
}

function wire() {
  document.querySelectorAll("nav .tab").forEach((b) => b.addEventListener("click", () => switchTab(b.dataset.tab)));
  $("#yaml").addEventListener("input", (e) => { S.text = e.target.value; updateDirty(); yamlChanged(); });
  $("#add-rule").addEventListener("click", addRule);
  $("#new-kind").addEventListener("change", starterChanged);
  $("#label-good").addEventListener("click", () => addLabel($("#completion").value, S.fields, $("#truncated").checked, true));
  $("#label-bad").addEventListener("click", () => addLabel($("#completion").value, S.fields, $("#truncated").checked, false));
  $("#use-new-scores").addEventListener("click", () => useNewScores());
  $("#new-scores-accept").addEventListener("click", () => useNewScores(true));
  $("#new-scores-keep").addEventListener("click", () => { $("#new-scores").hidden = true; status("the examples keep their old scores"); });
  $("#run-check").addEventListener("click", planRun);
  // the steps she chose survive a reload (per spec file)
  const stepsKey = `sailrl-studio-steps:${location.pathname}`;
  try { const kept = localStorage.getItem(stepsKey); if (kept) $("#run-steps").value = kept; } catch { /* storage off */ }
  $("#run-steps").addEventListener("input", (e) => { try { localStorage.setItem(stepsKey, e.target.value); } catch { /* storage off */ } });
  $("#run-stop").addEventListener("click", stopRun);
  $("#sample-go").addEventListener("click", sampleModel);
  $("#export-go").addEventListener("click", exportModel);
  $("#completion").addEventListener("input", () => tryNow());
  $("#truncated").addEventListener("change", () => tryNow());
  $("#num-tokens").addEventListener("input", () => tryNow());
  $("#row-index").addEventListener("change", (e) => chooseRow(parseInt(e.target.value, 10)));
  $("#row-random").addEventListener("click", () => chooseRow(null, true));
  $("#row-search").addEventListener("input", searchRows);
  $("#add-example").addEventListener("click", addExample);
  $("#save").addEventListener("click", save);
  $("#data-search").addEventListener("input", debounce(() => { S.dataOffset = 0; refreshRowsTable(); }, 200));
  $("#data-prev").addEventListener("click", () => { S.dataOffset = Math.max(0, S.dataOffset - 20); refreshRowsTable(); });
  $("#data-next").addEventListener("click", () => { S.dataOffset += 20; refreshRowsTable(); });
  $("#run-select").addEventListener("change", (e) => openRun(e.target.value));
  $("#step-select").addEventListener("change", loadRollouts);
  $("#kind-select").addEventListener("change", () => pollRun(true));
  for (const id of ["#order-select", "#rule-filter", "#verdict-filter"]) $(id).addEventListener("change", renderRollouts);
  $("#rollout-search").addEventListener("input", debounce(renderRollouts, 150));
  $("#pick-rollout").addEventListener("change", (e) => { const x = S.records[Number(e.target.value)]; if (x) tryRecord(x); });
  window.addEventListener("beforeunload", (e) => { if (S.text !== S.loadedText) e.preventDefault(); });
  setInterval(watchDisk, 1500);
  setInterval(() => { if (S.tab === "runs") { pollRun(); pollStatus(); } }, 2000);
  setInterval(() => { if (S.tab === "runs") loadRuns(); }, 3000);  // a run started elsewhere appears
}

wire();
loadStarters();
loadSpec().then(() => { loadLabels(); renderLabels(); refreshLabels(); return loadRuns(); }).catch((err) => banner(err.message, "error"));
