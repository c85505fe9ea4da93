// Headless Chromium for browser tests, driven over the Chrome DevTools Protocol (a WebSocket) with no npm
// package: Debian's `chromium`, installed with apt-get when missing (as root; the test is skipped, saying
// so, when that fails). `openPage(url)` gives a page to evaluate JavaScript in and to screenshot.

const CANDIDATES = ["chromium", "chromium-browser", "google-chrome"];

async function which(name: string): Promise<string | null> {
  try {
    const out = await new Deno.Command("sh", {
      args: ["-c", `command -v ${name}`],
      stdout: "piped",
      stderr: "null",
    })
      .output();
    const path = new TextDecoder().decode(out.stdout).trim();
    return out.success && path ? path : null;
  } catch {
    return null;
  }
}

async function run(cmd: string, args: string[]): Promise<boolean> {
  try {
    const out = await new Deno.Command(cmd, {
      args,
      stdout: "null",
      stderr: "piped",
      env: { DEBIAN_FRONTEND: "noninteractive" },
    }).output();
    if (!out.success) {
      console.error(`${cmd} ${args.join(" ")}: ${new TextDecoder().decode(out.stderr).slice(-500)}`);
    }
    return out.success;
  } catch (e) {
    console.error(`${cmd}: ${(e as Error).message}`);
    return false;
  }
}

/** The path of a Chromium, installing Debian's package when none is there; null (with the reason logged) if that fails. */
export async function chromiumPath(): Promise<string | null> {
  for (const c of CANDIDATES) {
    const p = await which(c);
    if (p) return p;
  }
  if (!(await which("apt-get"))) {
    console.error("chromium is not installed and there is no apt-get to install it");
    return null;
  }
  console.error("chromium is not installed: installing Debian's package (apt-get install -y chromium)");
  const ok = await run("apt-get", ["install", "-y", "-q", "chromium"]) ||
    (await run("apt-get", ["update", "-q"]) && await run("apt-get", ["install", "-y", "-q", "chromium"]));
  if (!ok) {
    console.error("installing chromium failed: the browser test is skipped");
    return null;
  }
  return await which("chromium");
}

/** A page in a headless Chromium. */
export interface Page {
  /** Evaluates `expression` in the page; its value (JSON-serializable). */
  evaluate<T>(expression: string): Promise<T>;
  /** Polls `expression` until it is truthy; its value, or an Error after `ms`. */
  waitFor<T>(expression: string, ms: number): Promise<T>;
  /** A PNG of the viewport. */
  screenshot(): Promise<Uint8Array>;
  close(): Promise<void>;
}

/** Starts Chromium headless at `url` (viewport `width` x `height`). */
export async function openPage(
  browser: string,
  url: string,
  opts: { width?: number; height?: number } = {},
): Promise<Page> {
  const profile = await Deno.makeTempDir({ prefix: "swactor-chromium-" });
  const child = new Deno.Command(browser, {
    args: [
      "--headless=new",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-dev-shm-usage",
      "--no-first-run",
      "--remote-debugging-port=0",
      `--user-data-dir=${profile}`,
      `--window-size=${opts.width ?? 1280},${opts.height ?? 800}`,
      "about:blank",
    ],
    stdout: "null",
    stderr: "piped",
  }).spawn();
  let log = "";
  const reader = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
  const deadline = Date.now() + 30_000;
  let endpoint: string | undefined;
  while (!endpoint) {
    if (Date.now() > deadline) throw new Error(`chromium gave no DevTools endpoint in 30 s:\n${log}`);
    const { value, done } = await reader.read();
    if (done) throw new Error(`chromium exited:\n${log}`);
    log += value;
    endpoint = /DevTools listening on (ws:\/\/\S+)/.exec(log)?.[1];
  }
  (async () => {
    for (;;) if ((await reader.read()).done) break;
  })().catch(() => {});
  const http = endpoint.replace(/^ws:\/\/([^/]+)\/.*$/, "http://$1");
  const targets = await (await fetch(`${http}/json/list`)).json() as {
    type: string;
    webSocketDebuggerUrl: string;
  }[];
  const target = targets.find((t) => t.type === "page");
  if (!target) throw new Error("chromium has no page target");
  const ws = new WebSocket(target.webSocketDebuggerUrl);
  await new Promise((resolve, reject) => {
    ws.onopen = resolve;
    ws.onerror = () => reject(new Error("cannot connect to chromium's DevTools"));
  });
  let next = 1;
  const waiting = new Map<number, { resolve(v: unknown): void; reject(e: Error): void }>();
  ws.onmessage = (e) => {
    const m = JSON.parse(e.data);
    const w = waiting.get(m.id);
    if (!w) return;
    waiting.delete(m.id);
    if (m.error) w.reject(new Error(`DevTools: ${m.error.message}`));
    else w.resolve(m.result);
  };
  const send = <T>(method: string, params: Record<string, unknown> = {}) =>
    new Promise<T>((resolve, reject) => {
      const id = next++;
      waiting.set(id, { resolve: resolve as (v: unknown) => void, reject });
      ws.send(JSON.stringify({ id, method, params }));
    });
  await send("Page.enable");
  await send("Page.navigate", { url });
  const evaluate = async <T>(expression: string): Promise<T> => {
    const r = await send<{ result: { value: T }; exceptionDetails?: { text: string } }>("Runtime.evaluate", {
      expression,
      returnByValue: true,
      awaitPromise: true,
    });
    if (r.exceptionDetails) throw new Error(`in the page: ${r.exceptionDetails.text}`);
    return r.result.value;
  };
  return {
    evaluate,
    async waitFor<T>(expression: string, ms: number): Promise<T> {
      const end = Date.now() + ms;
      let last: unknown;
      for (;;) {
        try {
          last = await evaluate<T>(expression);
          if (last) return last as T;
        } catch (e) {
          last = e;
        }
        if (Date.now() > end) {
          throw new Error(`the page never satisfied ${expression} in ${ms} ms (last: ${last})`);
        }
        await new Promise((r) => setTimeout(r, 200));
      }
    },
    async screenshot() {
      const r = await send<{ data: string }>("Page.captureScreenshot", { format: "png" });
      return Uint8Array.from(atob(r.data), (c) => c.charCodeAt(0));
    },
    async close() {
      ws.close();
      try {
        child.kill("SIGTERM");
      } catch { /* gone */ }
      await child.status;
      await Deno.remove(profile, { recursive: true }).catch(() => {});
    },
  };
}
