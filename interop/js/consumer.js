'use strict';
// Consumer driver for ali-ons (a pure-JS RocketMQ client), for the lab: joins a group against the
// emulator's native port, consumes, and writes EVENTS.md lines (consumer_started, message_consumed,
// rebalance, mq_added, mq_removed, consumer_stopped). ali-ons has no allocation hook of its own, so the
// driver wraps its strategy (to see cid_all and the result) and its process-queue update (to see which
// queues were added and dropped). Prints "READY <client id>" once started; SIGTERM closes it gracefully.
//
// Messages carry the address of the broker that stored them (storeHost); --broker-addrs maps those
// addresses to broker names, so message_consumed names the right broker when there are several.
//
//   node interop/js/consumer.js --namesrv HOST:PORT --group G --topic T [--node N] [--log-file F]
//        [--consume-ms N] [--broker-name B] [--broker-addrs NAME=HOST:PORT,...] [--instance NAME]
//        [--rebalance-ms N] [--persist-ms N]

const fs = require('fs');
const path = require('path');
const { Consumer } = require(path.join(__dirname, 'node_modules', 'ali-ons'));
const AllocateAveragely = require(path.join(
  __dirname, 'node_modules', 'ali-ons', 'lib', 'consumer', 'rebalance', 'allocate_message_queue_averagely'));

function parseArgs(argv) {
  const args = { consumeMs: 0, brokerName: 'broker-a', rebalanceMs: 10000, persistMs: 5000 };
  const names = {
    '--namesrv': 'namesrv', '--group': 'group', '--topic': 'topic', '--node': 'node',
    '--log-file': 'logFile', '--consume-ms': 'consumeMs', '--broker-name': 'brokerName',
    '--instance': 'instance', '--rebalance-ms': 'rebalanceMs', '--persist-ms': 'persistMs',
    '--broker-addrs': 'brokerAddrs',
  };
  for (let i = 0; i < argv.length; i += 2) {
    const key = names[argv[i]];
    if (!key || i + 1 >= argv.length) {
      process.stderr.write(`consumer.js: unknown or incomplete option ${argv[i]}\n`);
      process.exit(2);
    }
    args[key] = argv[i + 1];
  }
  for (const required of [ 'namesrv', 'group', 'topic' ]) {
    if (!args[required]) {
      process.stderr.write(`consumer.js: --${required} is required\n`);
      process.exit(2);
    }
  }
  for (const n of [ 'consumeMs', 'rebalanceMs', 'persistMs' ]) args[n] = Number(args[n]);
  args.brokerByAddr = new Map();
  args.brokerByPort = new Map();
  for (const item of (args.brokerAddrs || '').split(',').filter(Boolean)) {
    const m = /^([^=]+)=(.+):(\d+)$/.exec(item.trim());
    if (!m) {
      process.stderr.write(`consumer.js: --broker-addrs expects NAME=HOST:PORT,..., got ${item}\n`);
      process.exit(2);
    }
    args.brokerByAddr.set(`${m[2]}:${m[3]}`, m[1]);
    args.brokerByPort.set(m[3], m[1]);
  }
  return args;
}

// The broker a message came from, by its store host; the advertised host may differ from the one the
// lab knows, and the port alone is unique on one machine.
function brokerOf(msg) {
  const host = msg.storeHost || '';
  return args.brokerByAddr.get(host) || args.brokerByPort.get(host.split(':').pop()) || args.brokerName;
}

const args = parseArgs(process.argv.slice(2));
const node = args.node || `js-${process.pid}`;

function emit(event, fields) {
  const line = JSON.stringify(Object.assign({ ts_ms: Date.now(), event, node, role: 'consumer' }, fields));
  if (args.logFile) {
    fs.appendFileSync(args.logFile, line + '\n'); // synchronous: the process may be killed
  } else {
    process.stderr.write(line + '\n');
  }
}

const quietLogger = { info() {}, debug() {}, warn() {}, error(err) { emit('client_error', { error: String(err && err.stack || err) }); } };

let lastAllocation = null;
const strategy = new AllocateAveragely();
const wrappedStrategy = {
  get name() { return 'AVG'; },
  allocate(group, cid, mqSet, cidAll) {
    const result = strategy.allocate(group, cid, mqSet, cidAll);
    lastAllocation = { cidAll: cidAll.slice(), result };
    return result;
  },
};

// Only used to look name servers up over HTTP, which a fixed nameSrv never does.
const noHttp = { async request() { throw new Error('no HTTP name-server lookup with a fixed nameSrv'); } };

const consumer = new Consumer({
  httpclient: noHttp,
  nameSrv: args.namesrv,
  consumerGroup: args.group,
  instanceName: args.instance || `${process.pid}#${process.hrtime.bigint()}`,
  logger: quietLogger,
  allocateMessageQueueStrategy: wrappedStrategy,
  rebalanceInterval: args.rebalanceMs,
  persistConsumerOffsetInterval: args.persistMs,
  consumeFromWhere: 'CONSUME_FROM_FIRST_OFFSET',
});
const clientId = consumer._mqClient.clientId;
const group = args.group;

function queueKeys(topic) {
  const out = new Map();
  for (const [ key, entry ] of consumer._processQueueTable) {
    if (entry.messageQueue.topic === topic) out.set(key, entry);
  }
  return out;
}

// Which queues this rebalance added and dropped, and what the strategy was given.
const originalUpdate = consumer.updateProcessQueueTableInRebalance.bind(consumer);
consumer.updateProcessQueueTableInRebalance = async (topic, mqSet) => {
  const before = queueKeys(topic);
  const changed = await originalUpdate(topic, mqSet);
  const after = queueKeys(topic);
  for (const [ key, entry ] of before) {
    if (!after.has(key)) {
      const mq = entry.messageQueue;
      emit('mq_removed', { group, client_id: clientId, topic, broker: mq.brokerName, queue_id: Number(mq.queueId), reason: 'reallocated' });
    }
  }
  for (const [ key, entry ] of after) {
    if (!before.has(key)) {
      const mq = entry.messageQueue;
      emit('mq_added', { group, client_id: clientId, topic, broker: mq.brokerName, queue_id: Number(mq.queueId), next_offset: Number(entry.nextOffset) });
    }
  }
  if (lastAllocation) { // every subscribed topic, the retry topic included, as our own client reports
    emit('rebalance', {
      group, client_id: clientId, topic, strategy: 'AVG', cid_all: lastAllocation.cidAll,
      allocated: lastAllocation.result.map(mq => `${mq.brokerName}:${mq.queueId}`), changed: Boolean(changed),
    });
  }
  lastAllocation = null;
  return changed;
};

consumer.on('error', err => emit('client_error', { error: String(err && err.stack || err) }));

consumer.subscribe(args.topic, '*', async msg => {
  const started = Date.now();
  if (args.consumeMs > 0) await new Promise(resolve => setTimeout(resolve, args.consumeMs));
  emit('message_consumed', {
    // ali-ons shows the offset message id; RocketMQ's other clients show UNIQ_KEY, and so do the events.
    group, client_id: clientId, msg_id: (msg.properties && msg.properties.UNIQ_KEY) || msg.msgId, topic: msg.topic, broker: brokerOf(msg),
    queue_id: Number(msg.queueId), queue_offset: Number(msg.queueOffset), started_ms: started,
    mode: 'CONCURRENTLY', reconsume_times: Number(msg.reconsumeTimes || 0), offset_msg_id: msg.msgId,
    body: msg.body ? msg.body.toString('utf8').slice(0, 200) : '',
  });
});

let stopping = false;
async function stop() {
  if (stopping) return;
  stopping = true;
  try {
    for (const [ , entry ] of queueKeys(args.topic)) {
      const mq = entry.messageQueue;
      emit('mq_removed', { group, client_id: clientId, topic: args.topic, broker: mq.brokerName, queue_id: Number(mq.queueId), reason: 'shutdown' });
    }
    await consumer.close();
  } finally {
    emit('consumer_stopped', { group, client_id: clientId });
    process.exit(0);
  }
}
process.on('SIGTERM', stop);
process.on('SIGINT', stop);

consumer.ready().then(() => {
  emit('consumer_started', { group, client_id: clientId, client: 'ali-ons-3.12.0', topic: args.topic });
  process.stdout.write(`READY ${clientId}\n`);
}, err => {
  emit('client_error', { error: String(err && err.stack || err) });
  process.exit(1);
});
