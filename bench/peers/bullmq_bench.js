// BullMQ through one Redis, for bench/redis_cost.py: N jobs added with Queue.addBulk, then a
// Worker with a no-op processor (or, with --processor true, one that runs /bin/true in a child
// process as forkbox's jobs do) and the given concurrency drains them, while a QueueEvents
// reader (the client side, as job.waitUntilFinished would) takes every `completed` event with
// its return value. BullMQ's defaults otherwise: completed jobs are kept, events are trimmed
// at about 10,000. Prints one JSON object.
//
// Needs bullmq and ioredis: npm install --prefix bench/.node bullmq ioredis
// Usage: node bench/peers/bullmq_bench.js --redis redis://127.0.0.1:PORT --jobs 2000 --concurrency 2
//        [--processor noop|true]
"use strict";

const path = require("path");
const { execFile } = require("child_process");

function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

function need(mod) {
  const where = process.env.BULLMQ_NODE_MODULES || path.join(__dirname, "..", ".node", "node_modules");
  try {
    return require(path.join(where, mod));
  } catch (e) {
    console.error(`${mod} is not installed in ${where}: npm install --prefix bench/.node bullmq ioredis`);
    process.exit(2);
  }
}

async function main() {
  const { Queue, Worker, QueueEvents } = need("bullmq");
  const url = new URL(arg("redis", "redis://127.0.0.1:6379"));
  const jobs = Number(arg("jobs", "2000"));
  const concurrency = Number(arg("concurrency", "2"));
  const name = arg("queue", "bench");
  const processor = arg("processor", "noop");
  if (processor !== "noop" && processor !== "true") {
    console.error(`--processor ${processor}: use noop or true`);
    process.exit(2);
  }
  if (!(jobs > 0) || !(concurrency > 0)) {
    console.error("--jobs and --concurrency must be positive numbers");
    process.exit(2);
  }
  const connection = { host: url.hostname, port: Number(url.port || 6379), maxRetriesPerRequest: null };

  const events = new QueueEvents(name, { connection });
  await events.waitUntilReady();
  let completed = 0;
  let failed = 0;
  let firstDone = null;
  let lastDone = null;
  const finished = new Promise((resolve) => {
    const tick = () => {
      if (completed + failed >= jobs) resolve();
    };
    events.on("completed", () => {
      const now = Date.now();
      firstDone = firstDone ?? now;
      lastDone = now;
      completed += 1;
      tick();
    });
    events.on("failed", () => {
      failed += 1;
      tick();
    });
  });

  const queue = new Queue(name, { connection });
  const t0 = Date.now();
  const chunk = 1000;
  for (let i = 0; i < jobs; i += chunk) {
    const n = Math.min(chunk, jobs - i);
    await queue.addBulk(Array.from({ length: n }, (_, k) => ({ name: "noop", data: { n: i + k } })));
  }
  const enqueued = Date.now();
  const run = processor === "noop"
    ? async () => true
    : () => new Promise((resolve, reject) =>
      execFile("/bin/true", (err) => (err ? reject(err) : resolve(true))));
  const worker = new Worker(name, run, { connection, concurrency });
  await finished;
  const end = Date.now();
  await worker.close();
  await events.close();
  await queue.close();
  console.log(JSON.stringify({
    system: "bullmq",
    version: need("bullmq/package.json").version,
    jobs,
    concurrency,
    processor,
    completed,
    failed,
    enqueue_seconds: (enqueued - t0) / 1000,
    seconds: ((lastDone ?? end) - (firstDone ?? end)) / 1000,
    wall_seconds: (end - t0) / 1000,
  }));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
