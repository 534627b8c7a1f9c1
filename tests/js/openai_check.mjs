// Drives a Minions server's OpenAI Batch API with the official `openai` SDK, as an existing batch
// script would: only the base URL and the key differ from a run against OpenAI.
// Run by tests/integration/openai_sdk_test.cc:
//   node openai_check.mjs PHASE
// with, in the environment: OPENAI_BASE_URL (http://host:port/v1), MINIONS_KEY (a submitter of
// team A), MINIONS_VIEWER_KEY (a viewer of A), MINIONS_OTHER_KEY (a submitter of team B), INPUT
// (a JSONL file of requests), OUT_DIR (where downloaded files go) and, per phase, BAD_INPUT or
// CANCEL_AFTER and BIG_INPUT. Prints one JSON line of what it saw; exits non-zero (with the reason on stderr)
// when the API does not behave as OpenAI's does.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import OpenAI from 'openai';

const baseURL = process.env.OPENAI_BASE_URL;
const client = new OpenAI({ apiKey: process.env.MINIONS_KEY, baseURL });
const viewer = new OpenAI({ apiKey: process.env.MINIONS_VIEWER_KEY, baseURL, maxRetries: 0 });
const otherTeam = new OpenAI({ apiKey: process.env.MINIONS_OTHER_KEY, baseURL, maxRetries: 0 });
const outDir = process.env.OUT_DIR;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const lines = (text) => text.split('\n').filter((l) => l.length > 0).map((l) => JSON.parse(l));

async function poll(id, done, what) {
  const deadline = Date.now() + 9 * 60 * 1000;
  const seen = [];
  for (;;) {
    const batch = await client.batches.retrieve(id);
    if (seen[seen.length - 1] !== batch.status) seen.push(batch.status);
    if (done(batch)) return { batch, seen };
    if (Date.now() > deadline) throw new Error(`${what}: batch ${id} still ${batch.status} (seen: ${seen})`);
    await sleep(250);
  }
}

async function download(fileId, name) {
  if (!fileId) {
    fs.writeFileSync(`${outDir}/${name}`, '');
    return '';
  }
  const response = await client.files.content(fileId);
  const text = await response.text();
  fs.writeFileSync(`${outDir}/${name}`, text);
  return text;
}

async function expectError(promise, Type, status, what) {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof Type, `${what}: ${error}`);
    assert.equal(error.status, status, what);
    assert.ok(error.error && typeof error.error.message === 'string', `${what}: an OpenAI error object`);
    return error;
  }
  assert.fail(`${what}: it succeeded`);
}

const records = fs.readFileSync(process.env.INPUT, 'utf8').split('\n').filter((l) => l.trim()).length;

async function expirePhase() {
  // No executor runs yet: a short completion window passes with the batch untouched.
  const file = await client.files.create({ file: fs.createReadStream(process.env.INPUT), purpose: 'batch' });
  const created = await client.batches.create({
    input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '2s',
  });
  assert.equal(created.status, 'in_progress');
  assert.equal(created.usage, undefined, 'no usage before the batch ends');
  const { batch, seen } = await poll(created.id, (b) => ['expired', 'completed', 'failed', 'cancelled'].includes(b.status), 'expire');
  assert.equal(batch.status, 'expired', `seen: ${seen}`);
  assert.deepEqual([batch.usage.input_tokens, batch.usage.output_tokens], [0, 0], 'nothing ran');
  assert.ok(batch.expired_at >= batch.created_at);
  const errors = lines(await download(batch.error_file_id, 'expired-errors.jsonl'));
  assert.equal(errors.length, records);
  for (const e of errors) assert.equal(e.error.code, 'batch_expired');
  return { id: batch.id, seen, errors: errors.length };
}

async function mainPhase() {
  const models = [];
  for await (const model of client.models.list()) models.push(model.id);
  assert.ok(models.includes('text'), `models: ${models}`);

  const file = await client.files.create({ file: fs.createReadStream(process.env.INPUT), purpose: 'batch' });
  assert.equal(file.purpose, 'batch');
  assert.equal(file.bytes, fs.statSync(process.env.INPUT).size);
  assert.equal((await client.files.retrieve(file.id)).id, file.id);
  assert.equal(await (await client.files.content(file.id)).text(), fs.readFileSync(process.env.INPUT, 'utf8'));

  const params = {
    input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h', metadata: { run: 'sdk' },
  };
  const created = await client.batches.create(params, { headers: { 'Idempotency-Key': 'sdk-main-1' } });
  const retried = await client.batches.create(params, { headers: { 'Idempotency-Key': 'sdk-main-1' } });
  assert.equal(retried.id, created.id, 'a retried create with its Idempotency-Key makes one batch');
  assert.deepEqual(created.metadata, { run: 'sdk' });
  assert.equal(created.input_file_id, file.id);

  // A viewer reads but cannot create; another team sees nothing; a wrong key is 401.
  assert.equal((await viewer.batches.retrieve(created.id)).id, created.id);
  await expectError(viewer.batches.create(params), OpenAI.PermissionDeniedError, 403, 'viewer create');
  await expectError(otherTeam.batches.retrieve(created.id), OpenAI.NotFoundError, 404, "another team's batch");
  await expectError(otherTeam.files.retrieve(file.id), OpenAI.NotFoundError, 404, "another team's file");
  const wrong = new OpenAI({ apiKey: 'mn_sub_wrongwrongwrong', baseURL, maxRetries: 0 });
  await expectError(wrong.batches.list(), OpenAI.AuthenticationError, 401, 'a wrong key');

  const { batch, seen } = await poll(created.id, (b) => ['completed', 'failed', 'expired', 'cancelled'].includes(b.status), 'main');
  assert.equal(batch.status, 'completed', `seen: ${seen}; errors: ${JSON.stringify(batch.errors)}`);
  assert.equal(batch.request_counts.total, records);
  assert.equal(batch.request_counts.completed + batch.request_counts.failed, records);
  assert.ok(batch.completed_at >= batch.created_at && batch.in_progress_at >= batch.created_at);
  const output = await download(batch.output_file_id, 'output.jsonl');
  await download(batch.error_file_id, 'errors.jsonl');
  expectUsageOf(batch, lines(output));
  assert.equal((await client.files.retrieve(batch.output_file_id)).bytes, Buffer.byteLength(output));
  await expectError(otherTeam.files.content(batch.output_file_id), OpenAI.NotFoundError, 404, "another team's output");

  // A file that fails validation: the batch fails, and `errors` says which lines and why.
  const bad = await client.files.create({ file: fs.createReadStream(process.env.BAD_INPUT), purpose: 'batch' });
  const refused = await client.batches.create({ input_file_id: bad.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
  assert.equal(refused.status, 'failed');
  assert.ok(refused.errors.data.length > 0);
  for (const e of refused.errors.data) {
    assert.equal(typeof e.line, 'number');
    assert.equal(typeof e.message, 'string');
  }

  // Lists: every file; batches newest first, a page at a time.
  const fileIds = [];
  for await (const f of client.files.list()) fileIds.push(f.id);
  assert.ok(fileIds.includes(file.id) && fileIds.includes(bad.id));
  const firstPage = await client.batches.list({ limit: 1 });
  assert.equal(firstPage.data.length, 1);
  assert.equal(firstPage.has_more, true);
  const batchIds = [];
  for await (const b of client.batches.list({ limit: 1 })) batchIds.push(b.id);
  assert.ok(batchIds.includes(created.id) && batchIds.includes(refused.id), `listed: ${batchIds}`);
  assert.equal(new Set(batchIds).size, batchIds.length, 'no batch twice across pages');

  // A large file goes up and comes back byte for byte (on S3: a multipart upload as it arrives).
  if (process.env.BIG_INPUT) {
    const want = fs.readFileSync(process.env.BIG_INPUT);
    const bigFile = await client.files.create({ file: fs.createReadStream(process.env.BIG_INPUT), purpose: 'batch' });
    assert.equal(bigFile.bytes, want.length);
    const got = Buffer.from(await (await client.files.content(bigFile.id)).arrayBuffer());
    assert.ok(got.equals(want), 'the large file comes back as it went');
    assert.equal((await client.files.delete(bigFile.id)).deleted, true);
  }

  const deleted = await client.files.delete(bad.id);
  assert.equal(deleted.deleted, true);
  await expectError(client.files.retrieve(bad.id), OpenAI.NotFoundError, 404, 'a deleted file');
  return {
    id: batch.id, seen, counts: batch.request_counts, validation_errors: refused.errors.data, listed: batchIds.length,
  };
}

// usage: the sums of the answers' own usage, as the Batch API reports it.
function expectUsageOf(batch, outputLines) {
  let prompt = 0, completion = 0, reasoning = 0;
  for (const line of outputLines) {
    prompt += line.response.body.usage.prompt_tokens;
    completion += line.response.body.usage.completion_tokens;
    // Stated by models whose template reasons (none of the suite's): the batch sums them too.
    reasoning += line.response.body.usage.completion_tokens_details?.reasoning_tokens ?? 0;
  }
  assert.ok(prompt > 0 && completion > 0, `the answers state their usage: ${prompt}, ${completion}`);
  assert.deepEqual(batch.usage, {
    input_tokens: prompt, input_tokens_details: { cached_tokens: 0 },
    output_tokens: completion, output_tokens_details: { reasoning_tokens: reasoning },
    total_tokens: prompt + completion,
  });
}

async function cancelPhase() {
  const after = Number(process.env.CANCEL_AFTER);
  const file = await client.files.create({ file: fs.createReadStream(process.env.INPUT), purpose: 'batch' });
  const created = await client.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
  await poll(created.id, (b) => b.request_counts.completed >= after, 'cancel: some progress first');
  const cancelling = await client.batches.cancel(created.id);
  assert.equal(cancelling.status, 'cancelling');
  const { batch, seen } = await poll(created.id, (b) => b.status !== 'cancelling', 'cancel');
  assert.equal(batch.status, 'cancelled', `seen: ${seen}`);
  assert.ok(batch.cancelled_at >= batch.cancelling_at);
  const output = lines(await download(batch.output_file_id, 'cancel-output.jsonl'));
  const errors = lines(await download(batch.error_file_id, 'cancel-errors.jsonl'));
  assert.ok(output.length >= after, `partial output: ${output.length} lines`);
  assert.ok(output.length < records);
  assert.equal(output.length + errors.length, records);
  assert.ok(errors.some((e) => e.error.code === 'batch_cancelled'));
  // The counts say what ran: completed = output lines, failed = error lines of records that ran
  // (those that never ran have a batch_cancelled line and are not counted).
  const ran_failed = errors.filter((e) => e.error.code !== 'batch_cancelled').length;
  assert.deepEqual([batch.request_counts.completed, batch.request_counts.failed, batch.request_counts.total],
                   [output.length, ran_failed, records], 'request_counts of the cancelled batch');
  expectUsageOf(batch, output);
  return { id: batch.id, seen: ['cancelling', ...seen], output: output.length, errors: errors.length };
}

const phases = { expire: expirePhase, main: mainPhase, cancel: cancelPhase };
try {
  const result = await phases[process.argv[2]]();
  console.log(JSON.stringify(result));
} catch (error) {
  console.error(error && error.stack ? error.stack : error);
  process.exit(1);
}
