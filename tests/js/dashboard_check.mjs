// Loads the Minions web dashboard in headless Chromium and watches the first job that appears,
// through the DevTools protocol (Node's WebSocket; no npm package). Used by
// tests/integration/observability_test.cc.
//
//   MINIONS_DASHBOARD_TOKEN=mnv_... node --experimental-websocket dashboard_check.mjs URL SCREENSHOT.png [TIMEOUT_SECONDS]
//
// The dashboard sends a browser without a session to its login page: the check signs in there
// with the token, as a person would, and goes on from the page it lands on.
//
// Prints one JSON line per event on stdout:
//   {"event":"loaded"}                                  the page has drawn its first update
//   {"event":"progress","job":ID,"progress":P,"state":S} each time the job's progress changes
//   {"event":"done","job":ID,"values":[...],"tasks":N,"screenshot":PATH,
//    "charts":{"drawn":N,"points":P,"rate_series":R},  (charts drawn, fewest points, rate series)
//    "fleet":[{"device":D,"memory":M,"models":C}]}      (the fleet table's cells, one per executor)
// and exits 0 once the job is completed, 1 on a timeout or an error.
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const [url, screenshotPath, timeoutArg] = process.argv.slice(2);
if (!url || !screenshotPath) {
  console.error("usage: dashboard_check.mjs URL SCREENSHOT.png [TIMEOUT_SECONDS]");
  process.exit(2);
}
const deadline = Date.now() + Number(timeoutArg || 240) * 1000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const emit = (obj) => console.log(JSON.stringify(obj));

const profile = mkdtempSync(join(tmpdir(), "minions-chromium-"));
const chromium = spawn(process.env.CHROMIUM || "/usr/bin/chromium", [
  "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync",
  "--disable-dev-shm-usage", "--window-size=1400,1000", `--user-data-dir=${profile}`,
  "--remote-debugging-port=0", "about:blank",
], { stdio: ["ignore", "ignore", "pipe"] });
let chromiumLog = "";
chromium.stderr.on("data", (d) => { chromiumLog += d; });

function cleanup() {
  try { chromium.kill("SIGKILL"); } catch {}
  try { rmSync(profile, { recursive: true, force: true }); } catch {}
}

async function devtoolsPage() {
  const portFile = join(profile, "DevToolsActivePort");
  while (!existsSync(portFile) || readFileSync(portFile, "utf8").split("\n").length < 2) {
    if (Date.now() > deadline || chromium.exitCode !== null) throw new Error("chromium did not start: " + chromiumLog.slice(-2000));
    await sleep(100);
  }
  const port = readFileSync(portFile, "utf8").split("\n")[0].trim();
  for (;;) {
    const targets = await (await fetch(`http://127.0.0.1:${port}/json/list`)).json();
    const page = targets.find((t) => t.type === "page");
    if (page) return page.webSocketDebuggerUrl;
    await sleep(100);
  }
}

class Cdp {
  constructor(ws) {
    this.ws = ws; this.next = 1; this.pending = new Map();
    ws.addEventListener("message", (m) => {
      const msg = JSON.parse(m.data);
      const p = this.pending.get(msg.id);
      if (!p) return;
      this.pending.delete(msg.id);
      msg.error ? p.reject(new Error(msg.error.message)) : p.resolve(msg.result);
    });
  }
  static async connect(wsUrl) {
    const ws = new WebSocket(wsUrl);
    await new Promise((resolve, reject) => { ws.onopen = resolve; ws.onerror = () => reject(new Error("websocket")); });
    return new Cdp(ws);
  }
  send(method, params = {}) {
    const id = this.next++;
    this.ws.send(JSON.stringify({ id, method, params }));
    return new Promise((resolve, reject) => this.pending.set(id, { resolve, reject }));
  }
  async eval(expression) {
    const r = await this.send("Runtime.evaluate", { expression, returnByValue: true });
    if (r.exceptionDetails) throw new Error("page: " + JSON.stringify(r.exceptionDetails));
    return r.result.value;
  }
}

async function screenshot(cdp) {
  const shot = await cdp.send("Page.captureScreenshot", { format: "png", captureBeyondViewport: true });
  writeFileSync(screenshotPath, Buffer.from(shot.data, "base64"));
}

async function main() {
  const cdp = await Cdp.connect(await devtoolsPage());
  await cdp.send("Page.enable");
  await cdp.send("Runtime.enable");
  await cdp.send("Page.navigate", { url });
  // Sent to sign in first: fill in the token and submit the form.
  while ((await cdp.eval("location.pathname")) !== "/login" || !(await cdp.eval("!!document.getElementById('token')"))) {
    if (Date.now() > deadline) throw new Error("the dashboard did not ask to sign in");
    await sleep(100);
  }
  const token = process.env.MINIONS_DASHBOARD_TOKEN || "";
  await cdp.eval(`document.getElementById("token").value = ${JSON.stringify(token)};
                  document.querySelector("form").submit(); true`);
  while ((await cdp.eval("location.pathname")) !== "/") {
    if (Date.now() > deadline) throw new Error("signing in did not lead to the dashboard");
    await sleep(100);
  }
  // The page counts its successful updates in <body data-updates>.
  while (!(Number(await cdp.eval("document.body && document.body.dataset.updates || 0")) > 0)) {
    if (Date.now() > deadline) throw new Error("the dashboard never drew an update");
    await sleep(200);
  }
  emit({ event: "loaded" });
  const readJob = `(() => {
    const row = document.querySelector("#jobs tr[data-job]");
    if (!row) return null;
    return { job: row.dataset.job, progress: Number(row.querySelector("[data-progress]").dataset.progress),
             state: row.children[2].textContent,
             tasks: document.querySelectorAll("#job-tasks tbody tr").length };
  })()`;
  let job = null, values = [], last = null, shotTaken = false, opened = false;
  while (Date.now() < deadline) {
    const seen = await cdp.eval(readJob);
    if (seen) {
      if (!job) job = seen.job;
      if (!opened) {  // open the job's detail view, as a person would by clicking its row
        await cdp.eval(`document.querySelector('#jobs tr[data-job="${job}"]').click()`);
        opened = true;
      }
      if (seen.progress !== last) {
        last = seen.progress;
        values.push(seen.progress);
        emit({ event: "progress", job: seen.job, progress: seen.progress, state: seen.state });
      }
      // Mid-run is the picture worth keeping: partly filled bars, tasks running.
      if (!shotTaken && seen.progress > 0 && seen.progress < 1 && seen.tasks > 0) {
        await screenshot(cdp);
        shotTaken = true;
      }
      if (seen.state === "completed") {
        // The charts: each drawn (a uPlot canvas) with at least two points of history, the job's
        // rate among the series.
        const chartsReady = `(() => {
          const ids = ["chart-rates", "chart-executors", "chart-teams"];
          const drawn = ids.filter((id) => document.querySelector("#" + id + " .uplot canvas"));
          const points = ids.map((id) => Number(document.getElementById(id).dataset.points || 0));
          return { drawn: drawn.length, points: Math.min(...points),
                   rate_series: Number(document.getElementById("chart-rates").dataset.series || 0) };
        })()`;
        let charts = await cdp.eval(chartsReady);
        while ((charts.drawn < 3 || charts.points < 2 || charts.rate_series < 1) && Date.now() < deadline) {
          await sleep(200);
          charts = await cdp.eval(chartsReady);
        }
        if (!shotTaken) await screenshot(cdp);
        // The fleet table as drawn: each machine's device, usable memory and cached models.
        const fleet = await cdp.eval(`[...document.querySelectorAll("#fleet tbody tr")].map((tr) => ({
          device: tr.querySelector("td.device").textContent, memory: tr.querySelector("td.memory").textContent,
          models: tr.querySelector("td.models").textContent }))`);
        emit({ event: "done", job, values, tasks: seen.tasks, screenshot: screenshotPath, charts, fleet });
        return;
      }
    }
    await sleep(200);
  }
  throw new Error(`timed out; progress seen: ${JSON.stringify(values)}`);
}

main().then(() => { cleanup(); process.exit(0); }, (err) => { console.error(String(err.stack || err)); cleanup(); process.exit(1); });
