// The committed generated code must be exactly what `npm run generate` makes of the current
// proto: regenerate into a temp dir and compare byte for byte.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { delimiter, join, resolve } from "node:path";
import { test } from "node:test";

const PACKAGE = resolve(__dirname, "../..");
const GENERATED = "src/gen/ctxd/v1/ctxd.ts";

test("src/gen matches proto/ctxd/v1/ctxd.proto", () => {
  const out = mkdtempSync(join(tmpdir(), "ctxd-ts-gen-"));
  try {
    const bin = join(PACKAGE, "node_modules", ".bin");
    // buf runs the ts-proto plugin found on PATH, as `npm run generate` has it.
    execFileSync(join(bin, "buf"), ["generate", "../../proto", "--template", "buf.gen.yaml", "-o", out], {
      cwd: PACKAGE,
      env: { ...process.env, PATH: `${bin}${delimiter}${process.env.PATH}` },
      stdio: ["ignore", "inherit", "inherit"],
    });
    const fresh = readFileSync(join(out, GENERATED), "utf8");
    const committed = readFileSync(join(PACKAGE, GENERATED), "utf8");
    assert.ok(
      fresh === committed,
      `${GENERATED} differs from what the proto generates: run \`npm run generate\` in clients/typescript and commit it`,
    );
  } finally {
    rmSync(out, { recursive: true, force: true });
  }
});
