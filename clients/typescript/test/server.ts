// Test harness: a real `ctxd serve` on 127.0.0.1:0 over a SQLite file in its own temp dir, its
// address read from the one line it prints once bound (no fixed ports, no sleeps).
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, openSync, readFileSync, rmSync, writeFileSync, closeSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { createInterface } from "node:readline";

/** The repository root (this file runs from clients/typescript/dist/test). */
export const REPO = resolve(__dirname, "../../../..");
const STARTUP_MS = 60_000;

let cachedBin: string | undefined;

/** The server executable: `$CTXD_BIN`, or a release build of this checkout. Cargo names the
 * executable it built on stdout; asking it copes with CARGO_TARGET_DIR. */
export function ctxdBin(): string {
  if (cachedBin) return cachedBin;
  const fromEnv = process.env.CTXD_BIN;
  if (fromEnv) {
    if (!existsSync(fromEnv)) throw new Error(`CTXD_BIN=${fromEnv} is not a file`);
    return (cachedBin = fromEnv);
  }
  const out = execFileSync("cargo", ["build", "--release", "--bin", "ctxd", "--message-format=json-render-diagnostics"], {
    cwd: REPO,
    encoding: "utf8",
    stdio: ["ignore", "pipe", "inherit"],
    maxBuffer: 64 << 20,
  });
  for (const line of out.split("\n")) {
    if (!line.startsWith("{")) continue;
    const message = JSON.parse(line);
    if (message.reason === "compiler-artifact" && message.executable && message.target?.name === "ctxd") {
      return (cachedBin = message.executable as string);
    }
  }
  throw new Error("cargo build did not name the ctxd executable");
}

/** A running `ctxd serve`; `stop()` terminates it, checks it shut down cleanly, removes its dir. */
export class Server {
  readonly dir: string;
  address = "";
  #process!: ChildProcess;
  #log: string;
  /** The lines printed on stdout after the first: the other listeners' addresses. */
  #later: string[] = [];
  #onLine: (() => void)[] = [];

  private constructor(dir: string) {
    this.dir = dir;
    this.#log = join(dir, "ctxd.log");
  }

  /** Starts a server with `extra` flags; `prepare` may write files (keys, certificates) into
   * its directory first and return the flags that name them. */
  static async start(prepare: (dir: string) => string[] = () => []): Promise<Server> {
    const server = new Server(mkdtempSync(join(tmpdir(), "ctxd-ts-")));
    await server.#spawn(prepare(server.dir));
    return server;
  }

  async #spawn(extra: string[]): Promise<void> {
    const log = openSync(this.#log, "w");
    // Only the flags given here configure it, whatever CTXD_* the caller has set.
    const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("CTXD_")));
    this.#process = spawn(ctxdBin(), ["serve", "--listen", "127.0.0.1:0", "--db", join(this.dir, "ctxd.db"), ...extra], {
      stdio: ["ignore", "pipe", log],
      env,
    });
    closeSync(log);
    const lines = createInterface({ input: this.#process.stdout! });
    // Kept from the start: the lines after the first can come in the same chunk as it.
    let seen = 0;
    lines.on("line", (line) => {
      if (seen++ === 0) return;
      this.#later.push(line);
      for (const wake of this.#onLine.splice(0)) wake();
    });
    const first = new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no line from ctxd within ${STARTUP_MS} ms`)), STARTUP_MS);
      lines.once("line", (line) => {
        clearTimeout(timer);
        resolve(line);
      });
      this.#process.once("exit", (code) => {
        clearTimeout(timer);
        reject(new Error(`ctxd exited with ${code} before it listened`));
      });
    });
    let line = "";
    try {
      line = await first;
    } catch (error) {
      this.#process.kill("SIGKILL");
      throw new Error(`ctxd did not start (${(error as Error).message}); its log:\n${readFileSync(this.#log, "utf8")}`);
    }
    const match = /^ctxd listening on (\S+)$/.exec(line);
    if (!match) {
      this.#process.kill("SIGKILL");
      throw new Error(`ctxd's first line was ${JSON.stringify(line)}; its log:\n${readFileSync(this.#log, "utf8")}`);
    }
    this.address = match[1];
  }

  /** The address a later stdout line gives a listener (`gateway` for `ctxd gateway on ADDR`),
   * waited for as the address of the gRPC one is. */
  async addressOf(listener: string): Promise<string> {
    const deadline = Date.now() + STARTUP_MS;
    for (;;) {
      const line = this.#later.find((l) => l.startsWith(`ctxd ${listener} on `));
      if (line) return line.slice(`ctxd ${listener} on `.length);
      if (Date.now() > deadline) throw new Error(`no "ctxd ${listener} on" line within ${STARTUP_MS} ms`);
      await new Promise<void>((wake) => {
        this.#onLine.push(wake);
        setTimeout(wake, 100);
      });
    }
  }

  /** Writes a file into the server's directory and returns its path. */
  static write(dir: string, name: string, content: string | Uint8Array): string {
    const path = join(dir, name);
    writeFileSync(path, content);
    return path;
  }

  async stop(): Promise<void> {
    const p = this.#process;
    if (p.exitCode === null && p.signalCode === null) {
      const exited = new Promise<number | string | null>((resolve) => p.once("exit", (code, signal) => resolve(code ?? signal)));
      p.kill("SIGTERM");
      const timer = setTimeout(() => p.kill("SIGKILL"), 20_000);
      const code = await exited;
      clearTimeout(timer);
      if (code !== 0) throw new Error(`ctxd exited with ${code}; its log:\n${readFileSync(this.#log, "utf8")}`);
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}
