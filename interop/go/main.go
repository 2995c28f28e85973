// Consumer driver for Apache's Go RocketMQ client (github.com/apache/rocketmq-client-go/v2), for the lab.
//
// It joins a group as a push consumer (concurrently, or orderly with --orderly), lets the client allocate
// queues with its own strategy (AVG by default, --strategy names another the Go client has), and writes
// the lab's events (EVENTS.md), one JSON object per line, to --log-file:
//
//   - consumer_started / consumer_stopped around the client's life;
//   - rebalance: every call of the allocation strategy, which the driver wraps so that it records the
//     members (cid_all), the queues and the result the client computed; topic_route when the queues
//     the strategy is given change;
//   - mq_added / mq_removed: from the client's own log (the driver installs itself as the client's
//     logger): a new pull task starts with its queue's next offset, a queue is given up because it was
//     reallocated or its pulls expired, and every queue still held at shutdown;
//   - message_consumed when the listener returns success (started_ms, mode).
//
// Prints "READY <client id>" once started; SIGTERM or SIGINT shuts the consumer down gracefully. The
// flags are those of interop/cpp_consumer.py. With "producer" as its first argument the driver is a
// producer instead (producer.go).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/rlog"
)

// clientName is written in consumer_started, as the other drivers name their client and version.
const clientName = "go-2.1.2"

func nowMs() int64 { return time.Now().UnixMilli() }

// events writes EVENTS.md lines, each flushed at once (the process may be killed).
type events struct {
	mu   sync.Mutex
	out  *os.File
	node string
	role string // "consumer" when empty
}

func (e *events) emit(event string, fields map[string]any) {
	ts := nowMs()
	if v, ok := fields["ts_ms"].(int64); ok {
		ts = v
		delete(fields, "ts_ms")
	}
	var b strings.Builder
	head, _ := json.Marshal(event)
	node, _ := json.Marshal(e.node)
	role := e.role
	if role == "" {
		role = "consumer"
	}
	fmt.Fprintf(&b, `{"ts_ms":%d,"event":%s,"node":%s,"role":%q`, ts, head, node, role)
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		key, _ := json.Marshal(k)
		val, err := json.Marshal(fields[k])
		if err != nil {
			val, _ = json.Marshal(fmt.Sprint(fields[k]))
		}
		b.Write([]byte{','})
		b.Write(key)
		b.Write([]byte{':'})
		b.Write(val)
	}
	b.WriteString("}\n")
	e.mu.Lock()
	defer e.mu.Unlock()
	_, _ = e.out.WriteString(b.String())
}

func queueName(broker string, queueID int) string { return broker + ":" + strconv.Itoa(queueID) }

// tracker turns the client's allocation calls and log lines into events.
type tracker struct {
	ev       *events
	group    string
	clientID string
	strategy string

	mu        sync.Mutex
	routes    map[string][]string             // topic -> queues last given to the strategy
	allocated map[string][]string             // topic -> last allocation
	held      map[primitive.MessageQueue]bool // queues with a pull task
}

func newTracker(ev *events, group, clientID, strategy string) *tracker {
	return &tracker{
		ev: ev, group: group, clientID: clientID, strategy: strategy,
		routes: map[string][]string{}, allocated: map[string][]string{},
		held: map[primitive.MessageQueue]bool{},
	}
}

func names(mqs []*primitive.MessageQueue) []string {
	out := make([]string, 0, len(mqs))
	for _, mq := range mqs {
		out = append(out, queueName(mq.BrokerName, mq.QueueId))
	}
	return out
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// wrap records every call of the client's allocation strategy: the members, the queues and the result.
func (t *tracker) wrap(inner consumer.AllocateStrategy) consumer.AllocateStrategy {
	return func(group, currentCID string, mqAll []*primitive.MessageQueue, cidAll []string) []*primitive.MessageQueue {
		result := inner(group, currentCID, mqAll, cidAll)
		if len(mqAll) == 0 {
			return result // no topic to name
		}
		topic := mqAll[0].Topic
		queues := names(mqAll)
		got := names(result)
		members := append([]string(nil), cidAll...)
		sort.Strings(members)
		t.mu.Lock()
		routeChanged := !equal(t.routes[topic], queues)
		t.routes[topic] = queues
		prev, seen := t.allocated[topic]
		changed := !seen || !equal(prev, got)
		t.allocated[topic] = got
		t.mu.Unlock()
		if routeChanged {
			t.ev.emit("topic_route", map[string]any{"client_id": t.clientID, "topic": topic, "queues": queues})
		}
		t.ev.emit("rebalance", map[string]any{
			"group": t.group, "client_id": t.clientID, "topic": topic, "strategy": t.strategy,
			"cid_all": members, "allocated": got, "changed": changed,
			"current_cid": currentCID, "mq_all": queues,
		})
		return result
	}
}

// The client's log lines the tracker reads (rocketmq-client-go v2.1.2's wording).
const (
	logPullTaskStarted = "start a new Pull Message task for PullRequest"
	logRemoved         = "remove unnecessary mq when updateProcessQueueTable"
	logRemovedExpired  = "remove unnecessary mq because pull was expired, prepare to fix it"
	logLockFailed      = "do defaultConsumer, add a new mq failed, because lock failed"
)

var (
	// PullRequest.String(): [ConsumerGroup: G, Topic: T, MessageQueue: brokerName=B, queueId=N, nextOffset=O]
	pullRequestRe = regexp.MustCompile(
		`\[ConsumerGroup: (.*), Topic: (.*), MessageQueue: brokerName=(.*), queueId=(\d+), nextOffset=(-?\d+)\]`)
	// MessageQueue.String(): MessageQueue [topic=T, brokerName=B, queueId=N]
	messageQueueRe = regexp.MustCompile(`MessageQueue \[topic=(.*), brokerName=(.*), queueId=(\d+)\]`)
)

func (t *tracker) onLog(msg string, fields map[string]any) {
	switch msg {
	case logPullTaskStarted:
		m := pullRequestRe.FindStringSubmatch(fmt.Sprint(fields[rlog.LogKeyPullRequest]))
		if m == nil || m[1] != t.group {
			return
		}
		qid, _ := strconv.Atoi(m[4])
		next, _ := strconv.ParseInt(m[5], 10, 64)
		mq := primitive.MessageQueue{Topic: m[2], BrokerName: m[3], QueueId: qid}
		t.mu.Lock()
		t.held[mq] = true
		t.mu.Unlock()
		t.ev.emit("mq_added", map[string]any{
			"group": t.group, "client_id": t.clientID, "topic": mq.Topic, "broker": mq.BrokerName,
			"queue_id": qid, "next_offset": next,
		})
	case logRemoved, logRemovedExpired, logLockFailed:
		if g, ok := fields[rlog.LogKeyConsumerGroup]; ok && fmt.Sprint(g) != t.group {
			return
		}
		m := messageQueueRe.FindStringSubmatch(fmt.Sprint(fields[rlog.LogKeyMessageQueue]))
		if m == nil {
			return
		}
		qid, _ := strconv.Atoi(m[3])
		mq := primitive.MessageQueue{Topic: m[1], BrokerName: m[2], QueueId: qid}
		base := map[string]any{
			"group": t.group, "client_id": t.clientID, "topic": mq.Topic, "broker": mq.BrokerName,
			"queue_id": qid,
		}
		if msg == logLockFailed {
			t.ev.emit("lock_failed", base)
			return
		}
		t.mu.Lock()
		delete(t.held, mq)
		t.mu.Unlock()
		base["reason"] = "reallocated"
		if msg == logRemovedExpired {
			base["reason"] = "pull_expired"
		}
		t.ev.emit("mq_removed", base)
	}
}

// shutdown writes mq_removed for every queue still held when the consumer stopped.
func (t *tracker) shutdown() {
	t.mu.Lock()
	held := make([]primitive.MessageQueue, 0, len(t.held))
	for mq := range t.held {
		held = append(held, mq)
	}
	t.held = map[primitive.MessageQueue]bool{}
	t.mu.Unlock()
	sort.Slice(held, func(i, j int) bool { return held[i].String() < held[j].String() })
	for _, mq := range held {
		t.ev.emit("mq_removed", map[string]any{
			"group": t.group, "client_id": t.clientID, "topic": mq.Topic, "broker": mq.BrokerName,
			"queue_id": mq.QueueId, "reason": "shutdown",
		})
	}
}

// clientLogger is the Go client's logger: every call goes to the tracker, and Info and above to the
// client's own log file (when --client-log-dir is given), warnings and errors also to stderr.
type clientLogger struct {
	t    *tracker
	mu   sync.Mutex
	file *os.File
}

func (l *clientLogger) write(level, msg string, fields map[string]any) {
	if l.t != nil { // the producer mode tracks no queues
		l.t.onLog(msg, fields)
	}
	if level == "debug" {
		return
	}
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s", time.Now().Format("2006-01-02 15:04:05.000"), strings.ToUpper(level), msg)
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%v", k, fields[k])
	}
	b.WriteByte('\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.file != nil {
		_, _ = l.file.WriteString(b.String())
	}
	if level == "warning" || level == "error" || level == "fatal" {
		_, _ = os.Stderr.WriteString(b.String())
	}
}

func (l *clientLogger) Debug(msg string, fields map[string]any)   { l.write("debug", msg, fields) }
func (l *clientLogger) Info(msg string, fields map[string]any)    { l.write("info", msg, fields) }
func (l *clientLogger) Warning(msg string, fields map[string]any) { l.write("warning", msg, fields) }
func (l *clientLogger) Error(msg string, fields map[string]any)   { l.write("error", msg, fields) }
func (l *clientLogger) Fatal(msg string, fields map[string]any) {
	l.write("fatal", msg, fields)
	os.Exit(1)
}
func (l *clientLogger) Level(string)            {}
func (l *clientLogger) OutputPath(string) error { return nil }

// localIP is the address the client puts in its id (the client's own rule: the first IPv4 address of
// an interface that is up and not loopback).
func localIP() string {
	ifaces, err := net.Interfaces()
	if err != nil {
		return ""
	}
	for _, iface := range ifaces {
		if iface.Flags&net.FlagLoopback != 0 || iface.Flags&net.FlagUp == 0 {
			continue
		}
		addrs, err := iface.Addrs()
		if err != nil {
			continue
		}
		for _, addr := range addrs {
			if ipnet, ok := addr.(*net.IPNet); ok && !ipnet.IP.IsLoopback() {
				if ip4 := ipnet.IP.To4(); ip4 != nil {
					return ip4.String()
				}
			}
		}
	}
	return ""
}

// strategyByName: the Go client's strategies under the lab's names.
func strategyByName(name string) (consumer.AllocateStrategy, error) {
	switch strings.ToUpper(name) {
	case "AVG":
		return consumer.AllocateByAveragely, nil
	case "AVG_BY_CIRCLE":
		return consumer.AllocateByAveragelyCircle, nil
	case "CONSISTENT_HASH":
		return consumer.AllocateByConsistentHash(10), nil // Java's default virtual node count
	case "MACHINE_NEARBY":
		return consumer.AllocateByMachineNearby, nil // in this client: AVG
	}
	return nil, fmt.Errorf("unknown strategy %q (AVG, AVG_BY_CIRCLE, CONSISTENT_HASH, MACHINE_NEARBY)", name)
}

func parseBrokerAddrs(text string) (map[string]string, error) {
	out := map[string]string{}
	for _, item := range strings.Split(text, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, addr, ok := strings.Cut(item, "=")
		host, port, err := net.SplitHostPort(addr)
		if !ok || name == "" || err != nil || host == "" || port == "" {
			return nil, fmt.Errorf("expected NAME=HOST:PORT, got %q", item)
		}
		out[addr] = name
	}
	return out, nil
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "producer" {
		os.Exit(runProducer(os.Args[2:]))
	}
	os.Exit(run())
}

func run() int {
	fs := flag.NewFlagSet("go_consumer", flag.ContinueOnError)
	namesrv := fs.String("namesrv", "", "HOST:PORT of the name server (the emulator's native port)")
	group := fs.String("group", "", "consumer group")
	topic := fs.String("topic", "", "topic to subscribe to")
	tags := fs.String("tags", "*", "subscription expression")
	orderly := fs.Bool("orderly", false, "orderly listener (locks queues)")
	consumeMs := fs.Int("consume-ms", 0, "time the listener takes per message")
	brokerName := fs.String("broker-name", "broker-a", "broker name for a message whose queue is unknown")
	brokerAddrs := fs.String("broker-addrs", "", "NAME=HOST:PORT,... brokers' native addresses")
	instance := fs.String("instance", "", "instance name (default: pid and start time)")
	threads := fs.Int("threads", 4, "consume goroutines")
	accessKey := fs.String("access-key", "", "ACL session credentials (with --secret-key)")
	secretKey := fs.String("secret-key", "", "")
	node := fs.String("node", "", "node name in events (default: go-<pid>)")
	logFile := fs.String("log-file", "", "events file (JSON lines); stderr when absent")
	clientLogDir := fs.String("client-log-dir", "", "folder the client writes its own log to")
	strategyName := fs.String("strategy", "AVG", "allocation strategy: AVG, AVG_BY_CIRCLE, CONSISTENT_HASH")
	consumeFrom := fs.String("consume-from", "last", "where a new group starts: last or first")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if *namesrv == "" || *group == "" || *topic == "" {
		fmt.Fprintln(os.Stderr, "go_consumer: --namesrv, --group and --topic are required")
		return 2
	}
	addrs, err := parseBrokerAddrs(*brokerAddrs)
	if err != nil {
		fmt.Fprintln(os.Stderr, "go_consumer: --broker-addrs:", err)
		return 2
	}
	inner, err := strategyByName(*strategyName)
	if err != nil {
		fmt.Fprintln(os.Stderr, "go_consumer:", err)
		return 2
	}
	from := consumer.ConsumeFromLastOffset
	switch *consumeFrom {
	case "last":
	case "first":
		from = consumer.ConsumeFromFirstOffset
	default:
		fmt.Fprintln(os.Stderr, "go_consumer: --consume-from is last or first")
		return 2
	}

	if *node == "" {
		*node = fmt.Sprintf("go-%d", os.Getpid())
	}
	out := os.Stderr
	if *logFile != "" {
		out, err = os.OpenFile(*logFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, "go_consumer:", err)
			return 2
		}
		defer out.Close()
	}
	ev := &events{out: out, node: *node}
	if *instance == "" {
		*instance = fmt.Sprintf("%d#%d", os.Getpid(), time.Now().UnixNano())
	}
	// The client's own id rule (ClientIP@InstanceName), so that events can name it before it starts.
	clientID := localIP() + "@" + *instance
	strategy := strings.ToUpper(*strategyName)
	tr := newTracker(ev, *group, clientID, strategy)
	logger := &clientLogger{t: tr}
	if *clientLogDir != "" {
		if err := os.MkdirAll(*clientLogDir, 0o755); err == nil {
			path := filepath.Join(*clientLogDir, fmt.Sprintf("%d_rocketmq-go.log", os.Getpid()))
			logger.file, _ = os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		}
	}
	rlog.SetLogger(logger)

	mode := "CONCURRENTLY"
	if *orderly {
		mode = "ORDERLY"
	}
	opts := []consumer.Option{
		consumer.WithGroupName(*group),
		consumer.WithNsResolver(primitive.NewPassthroughResolver([]string{*namesrv})),
		consumer.WithInstance(*instance),
		consumer.WithConsumerModel(consumer.Clustering),
		consumer.WithConsumeFromWhere(from),
		consumer.WithConsumerOrder(*orderly),
		consumer.WithStrategy(tr.wrap(inner)),
		consumer.WithConsumeGoroutineNums(*threads),
	}
	if *accessKey != "" || *secretKey != "" {
		opts = append(opts, consumer.WithCredentials(primitive.Credentials{AccessKey: *accessKey, SecretKey: *secretKey}))
	}
	c, err := consumer.NewPushConsumer(opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "go_consumer: new push consumer:", err)
		return 1
	}
	listener := func(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		for _, msg := range msgs {
			started := nowMs()
			if *consumeMs > 0 {
				time.Sleep(time.Duration(*consumeMs) * time.Millisecond)
			}
			broker, qid := *brokerName, -1
			if msg.Queue != nil {
				broker, qid = msg.Queue.BrokerName, msg.Queue.QueueId
			} else if name, ok := addrs[msg.StoreHost]; ok {
				broker = name
			}
			body := string(msg.Body)
			if len(body) > 200 {
				body = body[:200]
			}
			ev.emit("message_consumed", map[string]any{
				"group": *group, "client_id": clientID, "msg_id": msg.MsgId, "topic": msg.Topic,
				"broker": broker, "queue_id": qid, "queue_offset": msg.QueueOffset, "started_ms": started,
				"mode": mode, "reconsume_times": msg.ReconsumeTimes, "body": body,
			})
		}
		return consumer.ConsumeSuccess, nil
	}
	if err := c.Subscribe(*topic, consumer.MessageSelector{Type: consumer.TAG, Expression: *tags}, listener); err != nil {
		fmt.Fprintln(os.Stderr, "go_consumer: subscribe:", err)
		return 1
	}
	stop := make(chan os.Signal, 2)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	// Before Start: the client rebalances while starting, and its first events follow this one.
	ev.emit("consumer_started", map[string]any{"group": *group, "client_id": clientID, "client": clientName, "topic": *topic})
	if err := c.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "go_consumer: start:", err)
		ev.emit("consumer_stopped", map[string]any{"group": *group, "client_id": clientID, "error": err.Error()})
		return 1
	}
	fmt.Printf("READY %s\n", clientID)
	<-stop
	if err := c.Shutdown(); err != nil {
		fmt.Fprintln(os.Stderr, "go_consumer: shutdown:", err)
	}
	tr.shutdown()
	ev.emit("consumer_stopped", map[string]any{"group": *group, "client_id": clientID})
	return 0
}
