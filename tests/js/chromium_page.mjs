// Headless Chromium driven through the DevTools protocol (Node's WebSocket; no npm package), and
// the dashboard's sign-in as a person does it: what the dashboard's browser checks share
// (dashboard_check.mjs, dashboard_history_check.mjs, dashboard_cancel_check.mjs).
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
export const emit = (obj) => console.log(JSON.stringify(obj));

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
  // Evaluates `expression` in the page (a promise is awaited) and answers its value.
  async eval(expression) {
    const r = await this.send("Runtime.evaluate", { expression, returnByValue: true, awaitPromise: true });
    if (r.exceptionDetails) throw new Error("page: " + JSON.stringify(r.exceptionDetails));
    return r.result.value;
  }
}

// A check script's command line: `required` arguments (their names, for the usage), then an
// optional TIMEOUT_SECONDS (`timeout` by default). The required arguments and a Browser whose
// deadline is that timeout from now; a missing argument: the usage on stderr and exit 2.
export function fromCommandLine(script, required, timeout = 120) {
  const args = process.argv.slice(2);
  if (required.some((_, i) => !args[i])) {
    console.error(`usage: ${script} ${required.join(" ")} [TIMEOUT_SECONDS]`);
    process.exit(2);
  }
  const browser = new Browser(Date.now() + Number(args[required.length] || timeout) * 1000);
  return { args: args.slice(0, required.length), browser };
}

// A Chromium with a fresh profile, and its page. `deadline`: Date.now() past which waits fail.
export class Browser {
  constructor(deadline) {
    this.deadline = deadline;
    this.profile = mkdtempSync(join(tmpdir(), "minions-chromium-"));
    this.log = "";
    this.process = spawn(process.env.CHROMIUM || "/usr/bin/chromium", [
      "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync",
      "--disable-dev-shm-usage", "--window-size=1400,1000", `--user-data-dir=${this.profile}`,
      "--remote-debugging-port=0", "about:blank",
    ], { stdio: ["ignore", "ignore", "pipe"] });
    this.process.stderr.on("data", (d) => { this.log += d; });
  }

  async page() {
    const portFile = join(this.profile, "DevToolsActivePort");
    while (!existsSync(portFile) || readFileSync(portFile, "utf8").split("\n").length < 2) {
      if (Date.now() > this.deadline || this.process.exitCode !== null) throw new Error("chromium did not start: " + this.log.slice(-2000));
      await sleep(100);
    }
    const port = readFileSync(portFile, "utf8").split("\n")[0].trim();
    for (;;) {
      const targets = await (await fetch(`http://127.0.0.1:${port}/json/list`)).json();
      const page = targets.find((t) => t.type === "page");
      if (page) {
        const cdp = await Cdp.connect(page.webSocketDebuggerUrl);
        await cdp.send("Page.enable");
        await cdp.send("Runtime.enable");
        return cdp;
      }
      await sleep(100);
    }
  }

  // A page signed in to the dashboard at `url` with MINIONS_DASHBOARD_TOKEN (signIn).
  async signedInPage(url) {
    const cdp = await this.page();
    await this.signIn(cdp, url, process.env.MINIONS_DASHBOARD_TOKEN || "");
    return cdp;
  }

  // Waits until `expression` is truthy in the page; answers its value.
  async until(cdp, expression, what) {
    for (;;) {
      const value = await cdp.eval(expression);
      if (value) return value;
      if (Date.now() > this.deadline) throw new Error("timed out waiting for " + what);
      await sleep(200);
    }
  }

  // Opens `url`, is sent to the login page, signs in there with `token` as a person would, and
  // waits for the dashboard's first update (the page counts them in <body data-updates>).
  async signIn(cdp, url, token) {
    await cdp.send("Page.navigate", { url });
    await this.until(cdp, "location.pathname === '/login' && !!document.getElementById('token')",
      "the dashboard to ask to sign in");
    await cdp.eval(`document.getElementById("token").value = ${JSON.stringify(token)};
                    document.querySelector("form").submit(); true`);
    await this.until(cdp, "location.pathname === '/'", "signing in to lead to the dashboard");
    await this.until(cdp, "Number(document.body && document.body.dataset.updates || 0) > 0", "the dashboard's first update");
  }

  // Opens job `jobId`'s page as a person does, by clicking its row in the jobs table, and waits
  // until the page shows it and `ready` (an expression) holds.
  async openJob(cdp, jobId, ready = "true", what = "the job's page") {
    await this.until(cdp, `!!document.querySelector('#jobs tr[data-job="${jobId}"]')`, "the job's row");
    await cdp.eval(`document.querySelector('#jobs tr[data-job="${jobId}"]').click(); true`);
    await this.until(cdp, `document.getElementById("job-id").textContent === ${JSON.stringify(jobId)} && (${ready})`, what);
  }

  async screenshot(cdp, path) {
    const shot = await cdp.send("Page.captureScreenshot", { format: "png", captureBeyondViewport: true });
    writeFileSync(path, Buffer.from(shot.data, "base64"));
  }

  close() {
    try { this.process.kill("SIGKILL"); } catch {}
    try { rmSync(this.profile, { recursive: true, force: true }); } catch {}
  }
}
