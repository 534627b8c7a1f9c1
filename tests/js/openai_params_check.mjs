// Request parameters through the official `openai` SDK, as a batch script would send them: what is
// served gets OpenAI's answer shapes (structured outputs, logprobs, penalties and biases), and what
// is not served is that record's error naming the parameter. Run by
// tests/integration/openai_sdk_test.cc (EveryRequestParameterIsServedOrRefusedByName):
//   node openai_params_check.mjs
// with OPENAI_BASE_URL, MINIONS_KEY and OUT_DIR in the environment. Prints one JSON line of what it
// saw; exits non-zero (the reason on stderr) when an answer is not what OpenAI's would be.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import OpenAI from 'openai';

const client = new OpenAI({ apiKey: process.env.MINIONS_KEY, baseURL: process.env.OPENAI_BASE_URL });
const outDir = process.env.OUT_DIR;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const lines = (text) => text.split('\n').filter((l) => l.length > 0).map((l) => JSON.parse(l));

const schema = {
  type: 'object',
  properties: { ok: { type: 'boolean' }, n: { type: 'integer', minimum: 0, maximum: 9 }, tag: { enum: ['a', 'b'] } },
  required: ['ok', 'n', 'tag'],
  additionalProperties: false,
};
const chat = (id, extra) => ({
  custom_id: id,
  method: 'POST',
  url: '/v1/chat/completions',
  body: { model: 'text', messages: [{ role: 'user', content: `Request ${id}.` }], max_tokens: 8, temperature: 0, ...extra },
});
const served = [
  chat('schema', { max_tokens: 120, response_format: { type: 'json_schema', json_schema: { name: 'r', strict: true, schema } } }),
  chat('schema-loose', { max_tokens: 120, temperature: 0.9, seed: 5, response_format: { type: 'json_schema', json_schema: { name: 'r', schema } } }),
  chat('logprobs', { logprobs: true, top_logprobs: 3 }),
  chat('penalties', { presence_penalty: 1.5, frequency_penalty: 0.5, logit_bias: { 5: -100, 7: 3 }, top_k: 20, min_p: 0.01, repeat_penalty: 1.1 }),
  chat('harmless', { user: 'u-1', store: false, metadata: { k: 'v' }, service_tier: 'auto', stream: false, n: 1 }),
  chat('grammar', { grammar: 'root ::= "yes" | "no"' }),
  chat('choices', { n: 3, temperature: 1.2, seed: 8 }),
];
const refused = {
  unknown: [chat('unknown', { frobnicate: true }), 'unsupported parameter: frobnicate'],
  // The test model's template (ChatML) renders no tools: tools are that record's error there.
  tools: [chat('tools', { tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }] }), 'does not render tools'],
  functions: [chat('functions', { functions: [{ name: 'f' }] }), 'unsupported parameter: functions'],
  n: [chat('n', { n: 17 }), 'body.n must be between 1 and 16'],
  stream: [chat('stream', { stream: true }), 'unsupported parameter: stream'],
  audio: [chat('audio', { audio: { voice: 'alloy', format: 'wav' } }), 'unsupported parameter: audio'],
  bias: [chat('bias', { logit_bias: { 99999999: 1 } }), "not in the model's vocabulary"],
  schema: [chat('bad-schema', { response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'array', maxItems: 1000000 } } } }), 'maxItems'],
  top: [chat('top', { top_logprobs: 2 }), 'needs body.logprobs: true'],
};

// Uploads the records as a batch file and waits for the batch to end.
async function runBatch(name, records) {
  const input = `${outDir}/${name}.jsonl`;
  fs.writeFileSync(input, records.map((r) => JSON.stringify(r)).join('\n') + '\n');
  const file = await client.files.create({ file: fs.createReadStream(input), purpose: 'batch' });
  const created = await client.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
  let batch = created;
  const deadline = Date.now() + 9 * 60 * 1000;
  while (!['completed', 'failed', 'expired', 'cancelled'].includes(batch.status)) {
    if (Date.now() > deadline) throw new Error(`batch still ${batch.status}`);
    await sleep(250);
    batch = await client.batches.retrieve(created.id);
  }
  return batch;
}

// Tool calls on the model whose template renders tools (Qwen 2.5's): required and named choices
// decode under the tool-call grammar, so even random weights answer with a well-formed call.
const weather = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Weather of a city',
    parameters: { type: 'object', properties: { city: { enum: ['Paris', 'Oslo'] }, days: { type: 'integer', minimum: 1, maximum: 7 } }, required: ['city', 'days'], additionalProperties: false },
  },
};
const toolChat = (id, extra) => chat(id, { model: 'text-tools', max_tokens: 200, tools: [weather], ...extra });
const toolRecords = [
  toolChat('tool-required', { tool_choice: 'required', parallel_tool_calls: false }),
  toolChat('tool-named', { tool_choice: { type: 'function', function: { name: 'get_weather' } } }),
];

const batch = await runBatch('params', [...served, ...Object.values(refused).map(([r]) => r)]);
try {
  assert.equal(batch.status, 'completed', JSON.stringify(batch.errors));
  const output = lines(await (await client.files.content(batch.output_file_id)).text());
  const errors = lines(await (await client.files.content(batch.error_file_id)).text());
  const byId = Object.fromEntries([...output, ...errors].map((l) => [l.custom_id, l]));
  assert.equal(output.length, served.length, `served: ${output.map((l) => l.custom_id)}`);
  assert.equal(errors.length, Object.keys(refused).length);

  for (const id of ['schema', 'schema-loose']) {
    const choice = byId[id].response.body.choices[0];
    assert.equal(choice.finish_reason, 'stop', `${id}: ${choice.message.content}`);
    const answer = JSON.parse(choice.message.content);
    assert.deepEqual(Object.keys(answer).sort(), ['n', 'ok', 'tag'], choice.message.content);
    assert.equal(typeof answer.ok, 'boolean');
    assert.ok(Number.isInteger(answer.n) && answer.n >= 0 && answer.n <= 9);
    assert.ok(['a', 'b'].includes(answer.tag));
  }
  const lp = byId.logprobs.response.body.choices[0].logprobs;
  assert.ok(lp.content.length > 0);
  for (const entry of lp.content) {
    assert.equal(typeof entry.token, 'string');
    assert.ok(entry.logprob <= 0);
    assert.ok(Array.isArray(entry.bytes));
    assert.equal(entry.top_logprobs.length, 3);
    assert.equal(entry.top_logprobs[0].token, entry.token, 'greedy: the token tops its list');
  }
  assert.equal(byId.penalties.response.status_code, 200);
  assert.match(byId.penalties.response.body.system_fingerprint, /^fp_[0-9a-f]{16}$/);
  assert.equal(byId.harmless.response.status_code, 200);
  assert.ok(['yes', 'no'].includes(byId.grammar.response.body.choices[0].message.content));
  const choices = byId.choices.response.body.choices;
  assert.deepEqual(choices.map((c) => c.index), [0, 1, 2]);
  for (const c of choices) assert.equal(c.message.role, 'assistant');
  // A refused request is OpenAI's batch output for a 400: the HTTP answer, error null.
  for (const [name, [record, message]] of Object.entries(refused)) {
    const line = byId[record.custom_id];
    assert.equal(line.error, null, `${name}: ${JSON.stringify(line)}`);
    assert.equal(line.response.status_code, 400, name);
    const error = line.response.body.error;
    assert.equal(error.type, 'invalid_request_error', name);
    assert.ok(error.message.includes(message), `${name}: ${JSON.stringify(line)}`);
    assert.ok('param' in error && 'code' in error, name);
  }
  assert.equal(byId.unknown.response.body.error.code, 'unsupported_parameter');
  assert.equal(byId.unknown.response.body.error.param, 'body.frobnicate');

  const toolBatch = await runBatch('tools', toolRecords);
  assert.equal(toolBatch.status, 'completed', JSON.stringify(toolBatch.errors));
  const toolLines = lines(await (await client.files.content(toolBatch.output_file_id)).text());
  assert.equal(toolLines.length, toolRecords.length, JSON.stringify(toolLines));
  for (const line of toolLines) {
    const choice = line.response.body.choices[0];
    assert.equal(choice.finish_reason, 'tool_calls', JSON.stringify(line));
    assert.equal(choice.message.content, null, JSON.stringify(line));
    assert.equal(choice.message.tool_calls.length, 1, JSON.stringify(line));
    const call = choice.message.tool_calls[0];
    assert.match(call.id, /^call_[0-9a-f]{16}$/);
    assert.equal(call.type, 'function');
    assert.equal(call.function.name, 'get_weather');
    const args = JSON.parse(call.function.arguments);
    assert.ok(['Paris', 'Oslo'].includes(args.city), call.function.arguments);
    assert.ok(Number.isInteger(args.days) && args.days >= 1 && args.days <= 7, call.function.arguments);
  }
  console.log(JSON.stringify({ id: batch.id, served: output.length, refused: errors.length, tool_calls: toolLines.length }));
} catch (error) {
  console.error(error && error.stack ? error.stack : error);
  process.exit(1);
}
