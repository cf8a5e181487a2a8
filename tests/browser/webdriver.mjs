// A small W3C WebDriver client over fetch, for Debian's chromedriver driving headless Chromium:
// no npm packages, so the browser tests need nothing but node and the two apt packages.
import { spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';

/** Starts chromedriver on a free port (it prints the port it took). */
export async function startDriver() {
  const bin = process.env.CHROMEDRIVER || '/usr/bin/chromedriver';
  const proc = spawn(bin, ['--port=0'], { stdio: ['ignore', 'pipe', 'inherit'] });
  const port = await new Promise((resolve, reject) => {
    let out = '';
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/started successfully on port (\d+)/);
      if (m) resolve(Number(m[1]));
    });
    proc.on('exit', (code) => reject(new Error(`chromedriver exited (${code}): ${out}`)));
  });
  return { proc, url: `http://127.0.0.1:${port}` };
}

export class Browser {
  static async open(driver) {
    const binary = process.env.CHROMIUM || '/usr/bin/chromium';
    const res = await post(`${driver.url}/session`, {
      capabilities: {
        alwaysMatch: {
          browserName: 'chrome',
          'goog:chromeOptions': {
            binary,
            args: ['--headless=new', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--window-size=1400,900'],
          },
        },
      },
    });
    const b = new Browser();
    b.base = `${driver.url}/session/${res.sessionId}`;
    return b;
  }

  async cmd(method, path, body) {
    const res = await fetch(`${this.base}${path}`, {
      method,
      headers: { 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const json = await res.json();
    if (!res.ok) throw new Error(`webdriver ${path}: ${json.value && json.value.message}`);
    return json.value;
  }

  goto(url) {
    return this.cmd('POST', '/url', { url });
  }

  /** Runs `script` (a function body; `arguments` holds args) in the page; returns its value. */
  run(script, ...args) {
    return this.cmd('POST', '/execute/sync', { script, args });
  }

  /** Polls `script` until it returns something truthy; fails with `what` after `ms`. */
  async waitFor(what, script, ms = 10000, ...args) {
    const end = Date.now() + ms;
    for (;;) {
      const v = await this.run(script, ...args);
      if (v) return v;
      if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  /** Opens `hash` of the inspector at `base`; waits until the page has loaded (or failed). */
  async open(base, hash) {
    // Through a blank page: a change of the hash alone would leave the last page's ready mark
    // up until the hashchange runs.
    await this.goto('about:blank');
    await this.goto(`${base}/${hash}`);
    return this.waitFor(`page ${hash}`, 'return document.body.dataset.ready || "";');
  }

  async screenshot(path) {
    const png = await this.cmd('GET', '/screenshot');
    writeFileSync(path, Buffer.from(png, 'base64'));
  }

  close() {
    return fetch(this.base, { method: 'DELETE' }).catch(() => {});
  }
}

async function post(url, body) {
  const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const json = await res.json();
  if (!res.ok) throw new Error(`webdriver: ${JSON.stringify(json.value)}`);
  return json.value;
}
