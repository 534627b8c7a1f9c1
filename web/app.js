// The Minions dashboard: polls the server's JSON endpoints once a second and redraws. No
// framework and no build step; the server compiles this file in (cmake/EmbedFiles.cmake).
"use strict";

const POLL_MS = 1000;
const PAGE = 100;
let selectedJob = null;
let selectedExecutor = null;
let jobsOffset = 0;
let tasksOffset = 0;
let csrf = "";            // this session's CSRF secret (/api/fleet), sent with a cancel
let lastDetail = null;    // the job page's last data
let cancelArmed = null;   // the job whose cancel was clicked once (a second click confirms)
let actionMessage = "";   // what the last action on the job page did

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c ?? "")));
  return node;
}

function stateBadge(state) { return el("span", { class: "state state-" + state }, state); }

function gib(bytes) { return bytes > 0 ? (bytes / 2 ** 30).toFixed(1) + " GiB" : "?"; }

function duration(seconds) {
  if (seconds == null || seconds < 0) return "?";
  if (seconds < 60) return Math.round(seconds) + " s";
  if (seconds < 3600) return Math.floor(seconds / 60) + " min " + Math.round(seconds % 60) + " s";
  return Math.floor(seconds / 3600) + " h " + Math.round((seconds % 3600) / 60) + " min";
}

function progressBar(fraction) {
  const pct = Math.round(fraction * 1000) / 10;
  return el("span", {}, el("span", { class: "bar" }, el("span", { style: "" })), el("span", { class: "pct" }, pct.toFixed(1) + " %"));
}

// A job's bar: blue while it runs or once completed; a failed, cancelled or expired job's is
// drawn in its state's colour, so an ended job never looks like a finished one.
function setBar(cell, fraction, state) {
  cell.replaceChildren(progressBar(fraction));
  const bar = cell.querySelector(".bar");
  if (ENDED_BADLY.has(state)) bar.classList.add("bar-" + state);
  bar.firstChild.style.width = (fraction * 100).toFixed(1) + "%";
}

const ENDED_BADLY = new Set(["failed", "cancelled", "expired"]);

// A job's rate and ETA as the one estimator (the server's) gives them: a job that did not
// complete has no rate or ETA to show, its state says what happened.
function rateText(j) {
  if (ENDED_BADLY.has(j.state)) return "-";
  return j.records_per_second.toFixed(1) + " rec/s";
}
function etaText(j) {
  if (j.state === "completed") return "done";
  if (ENDED_BADLY.has(j.state)) return j.state;
  return duration(j.eta_seconds);
}

async function getJson(path) {
  const res = await fetch(path, { cache: "no-store", credentials: "same-origin" });
  if (res.status === 401) {  // the session ended (signed out, token revoked or expired)
    location.assign("/login");
    throw new Error("signed out");
  }
  const body = await res.json();
  if (!res.ok) throw new Error(body.error || res.statusText);
  return body;
}

// "21-40 of 130" with previous/next buttons; `move` gets the new offset.
function renderPager(id, page, move) {
  const pager = document.getElementById(id);
  if (!page || page.total <= page.limit) { pager.replaceChildren(); return; }
  const prev = el("button", { type: "button", disabled: page.offset === 0 }, "previous");
  prev.addEventListener("click", () => move(Math.max(0, page.offset - page.limit)));
  const next = el("button", { type: "button", disabled: page.next_offset == null }, "next");
  next.addEventListener("click", () => move(page.next_offset));
  const last = Math.min(page.total, page.offset + page.limit);
  pager.replaceChildren(prev, next, el("span", { class: "muted" }, `${page.offset + 1}-${last} of ${page.total}`));
}

function renderFleet(fleet) {
  const body = document.querySelector("#fleet tbody");
  body.replaceChildren(...fleet.executors.map((e) => {
    const tasks = e.tasks.length === 0 ? el("span", { class: "muted" }, "none")
      : el("span", {}, e.tasks.map((t) => `${t.job} #${t.index} (${t.records_done}/${t.records})`).join(", "));
    // A gang: which one, and its leader (this executor, or the one it serves).
    const gang = !e.gang ? "" : el("span", { class: "gang", "data-gang": `${e.gang.job}/${e.gang.index}#${e.gang.attempt}` },
      ` gang of ${e.gang.size} for ${e.gang.job} #${e.gang.index}: `,
      e.gang.leads ? "leader" : `member, led by ${e.gang.leader_name || e.gang.leader}`);
    const row = el("tr", { class: "clickable", "data-executor": e.id },
      el("td", {}, e.name, " ", el("span", { class: "muted" }, e.id)),
      el("td", { class: "device" }, el("span", { class: "muted" }, (e.accelerator || "cpu") + " "), e.device || "?"),
      el("td", { class: "num memory" }, gib(e.usable_memory_bytes)),
      el("td", { class: "models" }, (e.models_shown || []).length === 0 ? el("span", { class: "muted" }, "none")
        : e.models_shown.map((m, i) => m + (e.models_cached[i] === e.model_loaded ? " (loaded)" : "")).join(", ")),
      el("td", {}, stateBadge(e.state), e.state_reason ? el("span", { class: "muted" }, " " + e.state_reason) : ""),
      el("td", {}, tasks, gang),
      el("td", { class: "num" }, e.records_done),
      el("td", { class: "num" }, duration(e.last_heartbeat_age_seconds) + " ago"));
    row.addEventListener("click", () => { location.hash = "executor=" + e.id; });
    return row;
  }));
  renderExecutor(fleet);
  const c = fleet.executors_by_state;
  const parts = Object.entries(c).map(([k, v]) => `${v} ${k}`);
  const jobs = fleet.jobs_by_state;
  document.getElementById("counts").textContent =
    `${fleet.executors.length} executors (${parts.join(", ") || "none"}) · ${jobs.running || 0} jobs running, ${jobs.queued || 0} queued`;
  const v = fleet.viewer;
  csrf = v.csrf || "";
  document.getElementById("viewer").textContent = `${v.principal}${v.team ? "@" + v.team : ""} (${v.role})`;
}

// One executor's page (click its row): what the fleet says of it, and its tasks of your team's
// jobs with their progress. Gone from the fleet (revoked): said so.
function renderExecutor(fleet) {
  const section = document.getElementById("executor-detail");
  section.hidden = !selectedExecutor;
  if (!selectedExecutor) return;
  const e = fleet.executors.find((x) => x.id === selectedExecutor);
  document.getElementById("executor-id").textContent = e ? `${e.name} (${e.id})` : selectedExecutor;
  if (!e) {
    document.getElementById("executor-summary").textContent = "not in the fleet (revoked, or never enrolled)";
    document.querySelector("#executor-tasks tbody").replaceChildren();
    return;
  }
  document.getElementById("executor-summary").replaceChildren(
    stateBadge(e.state), e.state_reason ? ` ${e.state_reason}` : "", e.drain_requested ? " · draining on request" : "",
    ` · ${(e.accelerator || "cpu")} ${e.device || "?"} · ${gib(e.usable_memory_bytes)} usable of ${gib(e.memory_bytes)}`,
    ` · ${e.os || "?"} · runners ${(e.runners || []).join(", ") || "none"} · ${e.records_done} records done`,
    ` · last heartbeat ${duration(e.last_heartbeat_age_seconds)} ago`,
    ` · models ${(e.models_shown || []).join(", ") || "none"}`);
  document.querySelector("#executor-tasks tbody").replaceChildren(...e.tasks.map((t) => el("tr", {},
    el("td", {}, el("a", { href: "#job=" + encodeURIComponent(t.job) }, t.job)),
    el("td", { class: "num" }, t.index), el("td", { class: "num" }, t.attempt),
    el("td", { class: "num" }, `${t.records_done}/${t.records}`))));
}

function renderJobs(list) {
  const body = document.querySelector("#jobs tbody");
  body.replaceChildren(...list.jobs.map((j) => {
    const progress = el("td", { class: "progress", "data-progress": String(j.progress) });
    setBar(progress, j.progress, j.state);
    const row = el("tr", { class: "clickable", "data-job": j.id },
      el("td", {}, j.id),
      el("td", {}, j.team),
      el("td", {}, stateBadge(j.state)),
      progress,
      el("td", { class: "num" }, `${j.records_succeeded + j.records_failed}/${j.records_total}` + (j.records_failed ? ` (${j.records_failed} failed)` : "")),
      el("td", { class: "num rate" }, rateText(j)),
      el("td", { class: "num eta" }, etaText(j)));
    row.addEventListener("click", () => { location.hash = "job=" + j.id; tasksOffset = 0; });
    return row;
  }));
  renderPager("jobs-pager", list, (offset) => { jobsOffset = offset; });
}

// The job page's actions, for those allowed: cancel (twice clicked: the second confirms) while
// the job may still run, and its files once it has them (a cancelled job's: what finished).
// Drawn again only when they change, so a poll never swaps a button under the pointer.
function renderActions(detail) {
  const j = detail.job, a = detail.actions || {};
  const box = document.getElementById("job-actions");
  const key = JSON.stringify([j.id, a, cancelArmed === j.id, actionMessage]);
  if (box.dataset.key === key) return;
  box.dataset.key = key;
  const parts = [];
  if (a.cancel) {
    const armed = cancelArmed === j.id;
    const button = el("button", { type: "button", id: "job-cancel", class: armed ? "danger" : "" },
      armed ? "Yes, cancel it (what finished is kept)" : "Cancel job");
    button.addEventListener("click", () => {
      if (armed) { cancelJob(j.id); return; }
      cancelArmed = j.id;
      renderActions(detail);
    });
    parts.push(button);
    if (armed) {
      const no = el("button", { type: "button", id: "job-cancel-no" }, "No, keep it running");
      no.addEventListener("click", () => { cancelArmed = null; renderActions(detail); });
      parts.push(no);
    }
  }
  if (a.results) parts.push(el("a", { href: a.results, id: "job-download", download: "" }, "Download results"));
  if (a.errors) parts.push(el("a", { href: a.errors, id: "job-download-errors", download: "" }, "Download errors"));
  if (actionMessage) parts.push(el("span", { class: "action-message" }, actionMessage));
  box.replaceChildren(...parts);
}

async function cancelJob(id) {
  cancelArmed = null;
  try {
    const res = await fetch("/api/job/cancel", {
      method: "POST", credentials: "same-origin", cache: "no-store",
      headers: { "X-CSRF-Token": csrf, "Content-Type": "application/x-www-form-urlencoded" },
      body: new URLSearchParams({ id }),
    });
    const body = await res.json().catch(() => ({}));
    actionMessage = res.ok ? "Cancelled: what finished is kept, in the files above once the page updates."
      : "Not cancelled: " + (body.error || res.statusText);
  } catch (err) {
    actionMessage = "Not cancelled: " + err.message;
  }
  if (lastDetail && lastDetail.job.id === id) renderActions(lastDetail);
}

function renderJob(detail) {
  lastDetail = detail;
  const j = detail.job;
  document.getElementById("job-detail").hidden = false;
  document.getElementById("job-id").textContent = j.id;
  // The same numbers as the jobs table: done = succeeded + failed + what running attempts did.
  const inFlight = j.records_in_flight ? `, ${j.records_in_flight} done by running tasks` : "";
  const never = ENDED_BADLY.has(j.state) ? j.records_total - j.records_succeeded - j.records_failed : 0;
  document.getElementById("job-summary").textContent =
    `${j.state} · ${(Math.round(j.progress * 1000) / 10).toFixed(1)} % · ${j.records_succeeded} succeeded, ${j.records_failed} failed${inFlight}` +
    (never > 0 ? `, ${never} never ran` : "") + ` of ${j.records_total} · ${rateText(j)}` +
    ` · tasks ${j.tasks_done}/${j.tasks_total} · model ${j.model}` + (j.error ? ` · ${j.error}` : "");
  const errors = detail.errors.map((e) => el("li", {}, `task ${e.task} attempt ${e.attempt} (${e.state}): ${e.message}`));
  if (j.error) errors.unshift(el("li", {}, j.error));
  // Failed records: the first error lines (once the job has ended), and how to get them all.
  const r = detail.record_errors || { failed: 0, first: [] };
  if (r.failed > 0) {
    errors.push(el("li", { class: "record-errors", "data-failed": String(r.failed) },
      `${r.failed} record${r.failed === 1 ? "" : "s"} failed` + (r.first.length ? `; the first ${r.first.length}:` : ""),
      el("ul", {}, ...r.first.map((e) => el("li", { "data-custom-id": e.custom_id }, `${e.custom_id || "(no custom_id)"}: ${e.code ? e.code + ": " : ""}${e.message}`))),
      el("span", { class: "muted" }, "All of them: "), el("code", {}, r.all)));
  }
  renderActions(detail);
  document.getElementById("job-errors").replaceChildren(...(errors.length ? errors : [el("li", { class: "muted" }, "none")]));
  document.querySelector("#job-tasks tbody").replaceChildren(...detail.tasks.map((t) => el("tr", { "data-task": t.index },
    el("td", { class: "num" }, t.index),
    el("td", {}, stateBadge(t.state)),
    el("td", { class: "num" }, t.attempt),
    el("td", {}, t.executor),
    el("td", { class: "num" }, `${t.state === "succeeded" ? t.records : t.records_done}/${t.records}`),
    el("td", { class: "num" }, t.failures),
    el("td", { class: "num" }, t.preemptions),
    el("td", {}, t.last_error))));
  renderPager("tasks-pager", detail.tasks_page, (offset) => { tasksOffset = offset; });
}

// --- charts (uPlot, served with the page) ---

const HISTORY_EVERY = 2;  // polls between history reads
const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
const charts = {};  // id -> {key, plot}
let polls = 0;

// Draws `data` ([times, ...series]) into the element `id`; a chart is made again only when its
// series change (uPlot keeps its series fixed), otherwise given the new data.
function drawChart(id, series, data, yLabel) {
  const node = document.getElementById(id);
  const key = series.map((s) => s.label + (s.dash ? "~" : "")).join("|");
  const width = Math.max(300, node.clientWidth || 400);
  let chart = charts[id];
  if (!chart || chart.key !== key) {
    if (chart) chart.plot.destroy();
    const options = {
      width, height: 220,
      // A history of one point (a fresh server) still spans a minute, not uPlot's default years.
      scales: { x: { time: true, range: (u, min, max) => (max - min < 60 ? [max - 60, max] : [min, max]) } },
      axes: [{}, { label: yLabel, size: 60 }],
      series: [{}, ...series.map((s, i) => ({
        label: s.label, stroke: s.color || PALETTE[i % PALETTE.length], width: 2, spanGaps: false,
        dash: s.dash ? [6, 4] : undefined, points: { show: false },
      }))],
    };
    chart = charts[id] = { key, plot: new uPlot(options, data, node) };
  } else {
    chart.plot.setData(data);
  }
  node.dataset.points = String(data[0].length);
  node.dataset.series = String(series.length);
}

function renderCharts(h) {
  const note = document.getElementById("charts-note");
  if (typeof uPlot === "undefined") {
    note.hidden = false;
    note.textContent = "This server was built without its charting library (scripts/setup installs it).";
    return;
  }
  const t = h.t;
  drawChart("chart-rates", h.jobs.map((j) => ({ label: j.id })), [t, ...h.jobs.map((j) => j.records_per_second)], "records/s");
  const states = [["busy", "#2ca02c"], ["available", "#1f77b4"], ["unavailable", "#ff7f0e"], ["offline", "#7f7f7f"]];
  drawChart("chart-executors", states.map(([s, color]) => ({ label: s, color })), [t, ...states.map(([s]) => h.executors[s])], "executors");
  const teamSeries = [], teamData = [];
  h.teams.forEach((team, i) => {
    const color = PALETTE[i % PALETTE.length];
    teamSeries.push({ label: team.team, color }, { label: team.team + " target", color, dash: true });
    teamData.push(team.usage_share.map((v) => v == null ? null : v * 100), team.target_share.map((v) => v == null ? null : v * 100));
  });
  drawChart("chart-teams", teamSeries, [t, ...teamData], "% of usage");
  // Tokens per second by team, every server's (a step's worth, drawn at the step's end).
  const tokenSeries = [], tokenData = [];
  (h.tokens || []).forEach((team, i) => {
    const color = PALETTE[i % PALETTE.length];
    tokenSeries.push({ label: team.team, color }, { label: team.team + " prompts", color, dash: true });
    tokenData.push(team.completion_per_second, team.prompt_per_second);
  });
  drawChart("chart-tokens", tokenSeries, [t, ...tokenData], "tokens/s");
  // The queue (admins: every team's tasks): waiting for an executor, and running.
  const queue = document.getElementById("chart-queue").closest("figure");
  queue.hidden = !h.tasks;
  if (h.tasks) {
    drawChart("chart-queue", [{ label: "waiting", color: "#ff7f0e" }, { label: "running", color: "#2ca02c" }],
      [t, h.tasks.pending, h.tasks.running], "tasks");
  }
  document.body.dataset.chartPoints = String(t.length);
}

// One executor's history (its page): records per second as a chart (tasks it ran, for admins),
// and its states as a list of changes, newest first.
function renderExecutorHistory(h) {
  if (typeof uPlot !== "undefined") {
    const series = [{ label: "records/s", color: "#2563eb" }];
    const data = [h.t, h.records_per_second];
    if (h.tasks) { series.push({ label: "tasks", color: "#2ca02c" }); data.push(h.tasks); }
    drawChart("chart-executor", series, data, "records/s");
  }
  const changes = [];
  h.state.forEach((state, i) => {
    const last = changes.length ? changes[changes.length - 1].state : undefined;
    if (state !== last) changes.push({ state, at: h.t[i] });
  });
  const list = document.getElementById("executor-states");
  list.replaceChildren(...changes.reverse().map((c) => el("li", { "data-state": c.state ?? "" },
    new Date(c.at * 1000).toLocaleTimeString() + " ", c.state == null ? el("span", { class: "muted" }, "not seen") : stateBadge(c.state))));
  list.dataset.points = String(h.t.length);
}

function readHash() {
  const m = location.hash.match(/job=([^&]+)/);
  const job = m ? decodeURIComponent(m[1]) : null;
  if (job !== selectedJob) { cancelArmed = null; actionMessage = ""; }
  selectedJob = job;
  if (!selectedJob) document.getElementById("job-detail").hidden = true;
  const x = location.hash.match(/executor=([^&]+)/);
  const executor = x ? decodeURIComponent(x[1]) : null;
  if (executor !== selectedExecutor) polls = 0;  // its history at the next poll
  selectedExecutor = executor;
  if (!selectedExecutor) document.getElementById("executor-detail").hidden = true;
}

async function poll() {
  const status = document.getElementById("status");
  try {
    const [fleet, jobs] = await Promise.all([getJson("/api/fleet"), getJson(`/api/jobs?offset=${jobsOffset}&limit=${PAGE}`)]);
    renderFleet(fleet);
    renderJobs(jobs);
    if (selectedJob) {
      renderJob(await getJson(`/api/job?id=${encodeURIComponent(selectedJob)}&offset=${tasksOffset}&limit=${PAGE * 5}`));
    }
    if (polls % HISTORY_EVERY === 0) {
      renderCharts(await getJson("/api/history"));
      if (selectedExecutor) renderExecutorHistory(await getJson(`/api/history/executor?id=${encodeURIComponent(selectedExecutor)}`));
    }
    polls++;
    status.textContent = "updated " + new Date().toLocaleTimeString();
    status.className = "status";
    document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
  } catch (err) {
    status.textContent = "cannot reach the server: " + err.message;
    status.className = "status error";
  }
  setTimeout(poll, POLL_MS);
}

window.addEventListener("hashchange", readHash);
document.getElementById("job-close").addEventListener("click", (e) => { e.preventDefault(); location.hash = ""; });
document.getElementById("executor-close").addEventListener("click", (e) => { e.preventDefault(); location.hash = ""; });
readHash();
poll();
