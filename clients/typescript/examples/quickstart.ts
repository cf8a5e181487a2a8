// The README's example, as a new user writes it; test/example.test.ts runs it against a server.
import { Client } from "ctxd-client";

async function main(address = process.env.CTXD_ADDRESS ?? "127.0.0.1:50051") {
  await using ctxd = new Client(address, { timeoutMs: 10_000 }); // closed when main returns
  const session = await ctxd.createSession({ metadata: { user: "ada" } });
  await ctxd.appendUser(session, "What is in README.md?");
  const call = { id: "call_1", name: "read_file", arguments: { path: "README.md" } };
  await ctxd.appendAssistant(session, "Let me read it.", [call]);
  await ctxd.appendToolResult(session, "call_1", "# ctxd\nA session store for LLM agents.");
  const context = await ctxd.render(session, { budget: 128_000 }); // OpenAI format by default
  console.log(JSON.stringify(context.messages, null, 2)); // ready for chat.completions.create
  console.log(`${context.report.totalTokens} tokens, fits: ${context.report.fits}`);
}
main().catch((error) => { console.error(String(error)); process.exitCode = 1; });
