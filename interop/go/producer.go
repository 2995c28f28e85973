// Producer mode of the driver (first argument "producer"): Apache's Go client sends --count messages to
// --topic at --rate messages per second, synchronously (the client's own queue selection and retries),
// and writes message_sent for every send the broker acknowledged, with the message id the consumers
// report (the client's UNIQ_KEY), the broker, queue and queue offset of the answer. It is the lab's
// workload on an engine the lab's own producer cannot speak to (Apache's broker).
//
// Prints "READY <client id>" once started and exits 0 after the last acknowledged send, or 1 when some
// sends failed even after the client's retries and the driver's own (appRetries; each such message a
// send_abandoned event); SIGTERM stops it early.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/apache/rocketmq-client-go/v2/rlog"
)

func runProducer(args []string) int {
	fs := flag.NewFlagSet("go_producer", flag.ContinueOnError)
	namesrv := fs.String("namesrv", "", "HOST:PORT of the name server")
	topic := fs.String("topic", "", "topic to send to")
	rate := fs.Float64("rate", 10, "messages per second (wall clock)")
	count := fs.Int("count", 100, "how many messages to send")
	size := fs.Int("size", 128, "body size in bytes")
	group := fs.String("group", "rmqlab_producer", "producer group")
	tags := fs.String("tags", "", "tag of every message")
	node := fs.String("node", "", "node name in events (default: go-producer-<pid>)")
	logFile := fs.String("log-file", "", "events file (JSON lines); stderr when absent")
	clientLogDir := fs.String("client-log-dir", "", "folder the client writes its own log to")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *namesrv == "" || *topic == "" || *rate <= 0 || *count <= 0 || *size <= 0 {
		fmt.Fprintln(os.Stderr, "go_producer: --namesrv and --topic are required; --rate, --count, --size > 0")
		return 2
	}
	if *node == "" {
		*node = fmt.Sprintf("go-producer-%d", os.Getpid())
	}
	out := os.Stderr
	if *logFile != "" {
		f, err := os.OpenFile(*logFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, "go_producer:", err)
			return 2
		}
		defer f.Close()
		out = f
	}
	ev := &events{out: out, node: *node, role: "producer"}
	// The client's own log goes to a file of the run, not to the driver's output.
	logger := &clientLogger{}
	if *clientLogDir != "" {
		if err := os.MkdirAll(*clientLogDir, 0o755); err == nil {
			path := filepath.Join(*clientLogDir, fmt.Sprintf("%d_rocketmq-go.log", os.Getpid()))
			logger.file, _ = os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		}
	}
	rlog.SetLogger(logger)

	instance := fmt.Sprintf("%d#%d", os.Getpid(), time.Now().UnixNano())
	clientID := localIP() + "@" + instance
	p, err := producer.NewDefaultProducer(
		producer.WithGroupName(*group),
		producer.WithNsResolver(primitive.NewPassthroughResolver([]string{*namesrv})),
		producer.WithInstanceName(instance),
		producer.WithRetry(2), // RocketMQ's retryTimesWhenSendFailed
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, "go_producer: new producer:", err)
		return 1
	}
	if err := p.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "go_producer: start:", err)
		return 1
	}
	fmt.Printf("READY %s\n", clientID)
	stop := make(chan os.Signal, 2)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)

	acked, failed := 0, 0
	t0 := time.Now()
	interval := time.Duration(float64(time.Second) / *rate)
loop:
	for i := 0; i < *count; i++ {
		if wait := time.Until(t0.Add(time.Duration(i) * interval)); wait > 0 {
			select {
			case <-stop:
				break loop
			case <-time.After(wait):
			}
		}
		msg := primitive.NewMessage(*topic, body(*node, i, *size))
		msg.WithKeys([]string{fmt.Sprintf("%s-%d", *node, i)})
		if *tags != "" {
			msg.WithTag(*tags)
		}
		res, why := sendWithRetries(p, msg, stop)
		if strings.HasPrefix(why, "stopped by ") {
			break loop
		}
		if why != "" {
			failed++
			fmt.Fprintf(os.Stderr, "go_producer: message %d failed: %s\n", i, why)
			ev.emit("send_abandoned", map[string]any{"topic": *topic, "index": i, "error": why})
			continue
		}
		acked++
		ev.emit("message_sent", map[string]any{
			"msg_id": res.MsgID, "topic": *topic, "broker": res.MessageQueue.BrokerName,
			"queue_id": res.MessageQueue.QueueId, "queue_offset": res.QueueOffset, "client_id": clientID,
		})
	}
	if err := p.Shutdown(); err != nil {
		fmt.Fprintln(os.Stderr, "go_producer: shutdown:", err)
	}
	if failed > 0 {
		fmt.Fprintf(os.Stderr, "go_producer: %d of %d sends failed (%d acknowledged)\n", failed, *count, acked)
		return 1
	}
	fmt.Printf("sent %d messages to %s\n", acked, *topic)
	return 0
}

// appRetries: how often the driver sends a message again that the client gave up on (after its own
// retries), as an application would; 1 s apart, for up to the client's 30 s route poll, so that a broker
// killed and started again (a JVM takes seconds to start), which the client keeps in its route until that
// poll, costs no message. The same message is sent again, so it
// keeps its UNIQ_KEY: a send that was stored after all shows up as a duplicate of one id, not as two.
const appRetries = 30

func sendWithRetries(p rocketmqProducer, msg *primitive.Message, stop <-chan os.Signal) (*primitive.SendResult, string) {
	why := ""
	for attempt := 0; attempt <= appRetries; attempt++ {
		if attempt > 0 {
			select {
			case s := <-stop:
				return nil, "stopped by " + s.String()
			case <-time.After(time.Second):
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		res, err := p.SendSync(ctx, msg)
		cancel()
		if err == nil && res != nil && res.Status == primitive.SendOK {
			return res, ""
		}
		why = fmt.Sprint(err)
		if err == nil && res != nil {
			why = fmt.Sprintf("send status %d", res.Status)
		}
	}
	return nil, why
}

// rocketmqProducer: the one method of the client's producer the driver sends with.
type rocketmqProducer interface {
	SendSync(ctx context.Context, msgs ...*primitive.Message) (*primitive.SendResult, error)
}

// body: the lab producer's payload (NODE:INDEX: then x up to size).
func body(node string, i, size int) []byte {
	head := fmt.Sprintf("%s:%d:", node, i)
	if len(head) >= size {
		return []byte(head[:size])
	}
	return []byte(head + strings.Repeat("x", size-len(head)))
}
