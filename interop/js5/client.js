'use strict';
// Driver for Apache's RocketMQ 5 Node.js client (npm rocketmq-client-nodejs 1.0.8), for the lab: talks
// gRPC to rmq-proxy. "consumer" joins a group as a push consumer (--kind push, the default) or a simple
// consumer (--kind simple: receive, process, ack) and writes EVENTS.md lines: consumer_started,
// message_consumed (mode CONCURRENTLY) when the listener returned success, consumer_stopped. The queue a
// message came from is read from its receipt handle (broker name, queue id, queue offset); a message
// revived into the pop retry topic names that topic. "producer" sends --count messages and prints one
// JSON line per acknowledged send (the proxy writes their message_sent events). SIGUSR1 hangs a
// consumer's listener and SIGUSR2 releases it (listener_hung / listener_released).
// Prints "READY <client id>" once started; SIGTERM closes it gracefully.
//
//   node interop/js5/client.js consumer --endpoints HOST:PORT --group G --topic T [--kind push|simple]
//        [--tags EXPR] [--consume-ms N] [--invisible-s N] [--batch N] [--node N] [--log-file F]
//   node interop/js5/client.js producer --endpoints HOST:PORT --topic T [--count N] [--prefix P]

const fs = require('fs');
const path = require('path');
const v5 = require(path.join(__dirname, 'node_modules', 'rocketmq-client-nodejs'));

const POP_RETRY_FLAG = '1';

function parseArgs(argv) {
  const role = argv[0];
  const args = {
    role, kind: 'push', tags: '*', consumeMs: 0, invisibleS: 20, batch: 16, count: 10, prefix: 'js5',
  };
  const names = {
    '--endpoints': 'endpoints', '--group': 'group', '--topic': 'topic', '--kind': 'kind', '--tags': 'tags',
    '--consume-ms': 'consumeMs', '--invisible-s': 'invisibleS', '--batch': 'batch', '--node': 'node',
    '--log-file': 'logFile', '--count': 'count', '--prefix': 'prefix', '--tag': 'tag',
  };
  for (let i = 1; i < argv.length; i += 2) {
    const key = names[argv[i]];
    if (!key || i + 1 >= argv.length) {
      process.stderr.write(`client.js: unknown or incomplete option ${argv[i]}\n`);
      process.exit(2);
    }
    args[key] = argv[i + 1];
  }
  if (role !== 'consumer' && role !== 'producer') {
    process.stderr.write('client.js: the first argument is "consumer" or "producer"\n');
    process.exit(2);
  }
  const required = role === 'consumer' ? [ 'endpoints', 'group', 'topic' ] : [ 'endpoints', 'topic' ];
  for (const r of required) {
    if (!args[r]) {
      process.stderr.write(`client.js: --${r} is required\n`);
      process.exit(2);
    }
  }
  if (args.kind !== 'push' && args.kind !== 'simple') {
    process.stderr.write(`client.js: --kind is push or simple, got ${args.kind}\n`);
    process.exit(2);
  }
  for (const n of [ 'consumeMs', 'invisibleS', 'batch', 'count' ]) args[n] = Number(args[n]);
  return args;
}

function eventWriter(node, file) {
  const fd = file ? fs.openSync(file, 'a') : 2;
  return (event, fields) => {
    const line = Object.assign({ ts_ms: Date.now(), event, node, role: 'consumer' }, fields);
    fs.writeSync(fd, JSON.stringify(line) + '\n');
  };
}

// "ckOffset popTime invisibleTime reviveQid retry brokerName queueId offset"
function queueOf(receipt, topic, group) {
  const parts = (receipt || '').split(' ');
  if (parts.length < 8) return { topic, broker: '', queueId: -1, offset: -1 };
  const real = parts[4] === POP_RETRY_FLAG ? `%RETRY%${group}_${topic}` : topic;
  return { topic: real, broker: parts[5], queueId: Number(parts[6]), offset: Number(parts[7]) };
}

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

// The client's own log goes to a file of the run (or nowhere), never to the driver's stdout.
const quietLogger = { info() {}, warn() {}, error() {}, debug() {} };

async function runConsumer(args) {
  const emit = eventWriter(args.node || `js5-${process.pid}`, args.logFile);
  let clientId = '';
  // The lab's hung-listener fault: SIGUSR1 blocks every listener call, SIGUSR2 lets them return.
  let hung = null;
  let release = () => {};
  process.on('SIGUSR1', () => {
    if (hung) return;
    hung = new Promise(resolve => { release = resolve; });
    emit('listener_hung', { group: args.group });
  });
  process.on('SIGUSR2', () => {
    if (!hung) return;
    hung = null;
    release();
    emit('listener_released', { group: args.group });
  });
  const process1 = async message => {
    while (hung) await hung;
    const started = Date.now();
    if (args.consumeMs > 0) await sleep(args.consumeMs);
    const q = queueOf(message.receiptHandle, message.topic, args.group);
    emit('message_consumed', {
      group: args.group, client_id: clientId, msg_id: message.messageId, topic: q.topic, broker: q.broker,
      queue_id: q.queueId, queue_offset: q.offset, started_ms: started, mode: 'CONCURRENTLY',
      reconsume_times: Math.max(0, (message.deliveryAttempt || 1) - 1),
      body: Buffer.from(message.body || '').toString('utf8').slice(0, 200),
    });
  };
  const subscriptions = new Map().set(args.topic, new v5.FilterExpression(args.tags));
  const common = { endpoints: args.endpoints, consumerGroup: args.group, subscriptions, logger: quietLogger };
  let consumer;
  if (args.kind === 'push') {
    consumer = new v5.PushConsumer(Object.assign({}, common, {
      messageListener: {
        async consume(message) {
          await process1(message);
          return v5.ConsumeResult.SUCCESS;
        },
      },
    }));
  } else {
    consumer = new v5.SimpleConsumer(Object.assign({}, common, { awaitDuration: 20000 }));
  }
  await consumer.startup();
  clientId = consumer.clientId;
  emit('consumer_started', { group: args.group, client_id: clientId, client: 'js5-1.0.8', topic: args.topic });
  process.stdout.write(`READY ${clientId}\n`);
  let stopping = false;
  const stopped = new Promise(resolve => {
    for (const sig of [ 'SIGTERM', 'SIGINT' ]) {
      process.on(sig, () => {
        stopping = true;
        resolve();
      });
    }
  });
  if (args.kind === 'simple') {
    // Not awaited: a receive is a long poll, and SIGTERM must not wait for it to end.
    (async () => {
      while (!stopping) {
        let messages = [];
        try {
          messages = await consumer.receive(args.batch, args.invisibleS * 1000);
        } catch (err) {
          if (!/MESSAGE_NOT_FOUND|no new message/i.test(String(err && err.message))) await sleep(1000);
          continue;
        }
        for (const message of messages) {
          if (stopping) return;
          await process1(message);
          try {
            await consumer.ack(message);
          } catch (err) {
            emit('ack_failed', {
              group: args.group, client_id: clientId, msg_id: message.messageId,
              error: String(err && err.message).slice(0, 200),
            });
          }
        }
      }
    })();
  }
  await stopped;
  // The push consumer's own shutdown first waits for its long polls in flight (up to 20 s here).
  await consumer.shutdown();
  emit('consumer_stopped', { group: args.group, client_id: clientId });
  process.exit(0);
}

async function runProducer(args) {
  const producer = new v5.Producer({ endpoints: args.endpoints, topics: [ args.topic ], logger: quietLogger });
  await producer.startup();
  process.stdout.write(`READY ${producer.clientId}\n`);
  for (let i = 0; i < args.count; i++) {
    const body = `${args.prefix}-${i}`;
    const message = { topic: args.topic, body: Buffer.from(body) };
    if (args.tag) message.tag = args.tag;
    const receipt = await producer.send(message);
    process.stdout.write(JSON.stringify({ sent: receipt.messageId, offset: Number(receipt.offset), body }) + '\n');
  }
  await producer.shutdown();
  process.exit(0);
}

const args = parseArgs(process.argv.slice(2));
(args.role === 'consumer' ? runConsumer(args) : runProducer(args)).catch(err => {
  process.stderr.write(`client.js: ${err && err.stack || err}\n`);
  process.exit(1);
});
