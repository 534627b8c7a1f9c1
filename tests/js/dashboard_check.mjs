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
//    "charts":{"drawn":N,"points":P,"rate_series":R,"token_series":T},  (charts drawn, fewest
//                                                       points, rate series, tokens/s series)
//    "executor_page":{"states":N,"chart":B},            (an executor's page: state changes listed,
//                                                       its records/s chart drawn)
//    "fleet":[{"device":D,"memory":M,"models":C}]}      (the fleet table's cells, one per executor)
// and exits 0 once the job is completed, 1 on a timeout or an error.
import { emit, fromCommandLine, sleep } from "./chromium_page.mjs";

const { args: [url, screenshotPath], browser } =
  fromCommandLine("dashboard_check.mjs", ["URL", "SCREENSHOT.png"], /*timeout=*/240);
const deadline = browser.deadline;
const screenshot = (cdp) => browser.screenshot(cdp, screenshotPath);

async function main() {
  const cdp = await browser.signedInPage(url);
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
                   rate_series: Number(document.getElementById("chart-rates").dataset.series || 0),
                   token_series: Number(document.getElementById("chart-tokens").dataset.series || 0) };
        })()`;
        // The job's tokens reach the chart at the end of the step they were admitted in.
        let charts = await cdp.eval(chartsReady);
        while ((charts.drawn < 3 || charts.points < 2 || charts.rate_series < 1 || charts.token_series < 1) &&
               Date.now() < deadline) {
          await sleep(200);
          charts = await cdp.eval(chartsReady);
        }
        if (!shotTaken) await screenshot(cdp);
        // The fleet table as drawn: each machine's device, usable memory and cached models.
        const fleet = await cdp.eval(`[...document.querySelectorAll("#fleet tbody tr")].map((tr) => ({
          device: tr.querySelector("td.device").textContent, memory: tr.querySelector("td.memory").textContent,
          models: tr.querySelector("td.models").textContent }))`);
        // An executor's page, as a person opens it by clicking its row: its states and its chart.
        await cdp.eval(`document.querySelector("#fleet tbody tr[data-executor]").click(); true`);
        const executorReady = `(() => {
          const states = document.querySelectorAll("#executor-states li").length;
          const chart = !!document.querySelector("#chart-executor .uplot canvas");
          return states > 0 && chart ? { states, chart } : null;
        })()`;
        let executorPage = await cdp.eval(executorReady);
        while (!executorPage && Date.now() < deadline) {
          await sleep(200);
          executorPage = await cdp.eval(executorReady);
        }
        emit({ event: "done", job, values, tasks: seen.tasks, screenshot: screenshotPath, charts, fleet,
               executor_page: executorPage || { states: 0, chart: false } });
        return;
      }
    }
    await sleep(200);
  }
  throw new Error(`timed out; progress seen: ${JSON.stringify(values)}`);
}

main().then(() => { browser.close(); process.exit(0); },
  (err) => { console.error(String(err.stack || err)); browser.close(); process.exit(1); });
