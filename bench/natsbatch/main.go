// natsbatch: a load generator for JetStream's atomic batch publish and counters, on
// the official Go NATS client (nats.go as natsbench uses it: only PublishMsg, Request
// and subscriptions, so Debian's package builds it). Its flags and its one JSON line
// are natsbench's, so bench/run.py runs it the same way.
//
//	-mode jsbatch    atomic batches of -batch messages of -size bytes: the first
//	                 -batch - 1 published without a reply, the last with
//	                 Nats-Batch-Commit: 1 as a request; -window batches in flight per
//	                 publisher, each answered by one PubAck
//	-mode jscounter  Nats-Incr: +1 on -subjects subjects of a counter stream, every
//	                 increment acknowledged; -window acknowledgements outstanding
//	                 per publisher
//
// msgs_per_sec counts stored messages (every message of a batch).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
)

type result struct {
	Mode       string  `json:"mode"`
	URL        string  `json:"url"`
	Msgs       int     `json:"msgs"`
	Size       int     `json:"size"`
	Pubs       int     `json:"pubs"`
	Subs       int     `json:"subs"`
	Replicas   int     `json:"replicas,omitempty"`
	Batch      int     `json:"batch,omitempty"`
	Seconds    float64 `json:"seconds"`
	MsgsPerSec float64 `json:"msgs_per_sec"`
	MBPerSec   float64 `json:"mb_per_sec"`
	Error      string  `json:"error,omitempty"`
}

func die(r *result, err error) {
	r.Error = err.Error()
	b, _ := json.Marshal(r)
	fmt.Println(string(b))
	os.Exit(1)
}

func connect(url string) *nats.Conn {
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectBufSize(64*1024*1024))
	if err != nil {
		fmt.Fprintln(os.Stderr, "connect:", err)
		os.Exit(2)
	}
	return nc
}

// api sends a JetStream API request and fails on an error answer.
func api(nc *nats.Conn, subject string, body interface{}) error {
	var data []byte
	if body != nil {
		data, _ = json.Marshal(body)
	}
	var last error
	for try := 0; try < 5; try++ { // a new cluster's meta leader may drop the first
		msg, err := nc.Request(subject, data, 10*time.Second)
		if err != nil {
			last = err
			continue
		}
		var resp struct {
			Error *struct {
				Code        int    `json:"code"`
				Description string `json:"description"`
			} `json:"error"`
		}
		json.Unmarshal(msg.Data, &resp)
		if resp.Error != nil && resp.Error.Code != 404 {
			return fmt.Errorf("%s: %s", subject, resp.Error.Description)
		}
		return nil
	}
	return last
}

// pipeline runs one publisher: send(i, reply) for each of units units (a batch or an
// increment), at most window unanswered; every answer must be a PubAck.
func pipeline(nc *nats.Conn, units, window int, send func(i int, reply string) error) error {
	prefix := "_BENCH." + nuid.Next() + "."
	slots := make(chan struct{}, window)
	done := make(chan error, 1)
	var answered int64
	var failed int32
	sub, err := nc.Subscribe(prefix+"*", func(m *nats.Msg) {
		if len(m.Data) == 0 || strings.Contains(string(m.Data), "\"error\"") {
			if atomic.CompareAndSwapInt32(&failed, 0, 1) {
				done <- fmt.Errorf("not acknowledged: %q", string(m.Data))
			}
			return
		}
		<-slots
		if atomic.AddInt64(&answered, 1) == int64(units) {
			done <- nil
		}
	})
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	sub.SetPendingLimits(-1, -1)
	for i := 0; i < units; i++ {
		select {
		case slots <- struct{}{}:
		case err := <-done:
			return err
		}
		if err := send(i, prefix+strconv.Itoa(i)); err != nil {
			return err
		}
	}
	nc.Flush()
	return <-done
}

func main() {
	mode := flag.String("mode", "jsbatch", "jsbatch | jscounter")
	url := flag.String("url", nats.DefaultURL, "server URL(s), comma separated")
	subj := flag.String("subject", "bench.batch", "subject (jscounter: prefix of -subjects subjects)")
	n := flag.Int("n", 100000, "messages in total")
	size := flag.Int("size", 128, "payload bytes (jsbatch)")
	pubs := flag.Int("pubs", 1, "publishers, one connection each")
	replicas := flag.Int("replicas", 1, "stream replicas")
	storage := flag.String("storage", "file", "file | memory")
	batch := flag.Int("batch", 100, "messages per atomic batch (jsbatch)")
	window := flag.Int("window", 0, "batches (jsbatch, default 8) or increments (jscounter, default 500) in flight per publisher")
	subjects := flag.Int("subjects", 8, "counter subjects (jscounter)")
	timeout := flag.Duration("timeout", 120*time.Second, "give up after")
	flag.Parse()
	r := &result{Mode: *mode, URL: *url, Msgs: *n, Size: *size, Pubs: *pubs, Replicas: *replicas}
	nc := connect(*url)
	cfg := map[string]interface{}{"name": "BENCH", "storage": *storage, "num_replicas": *replicas}
	switch *mode {
	case "jsbatch":
		cfg["subjects"] = []string{*subj}
		cfg["allow_atomic"] = true
		r.Batch = *batch
		if *window == 0 {
			*window = 8
		}
	case "jscounter":
		cfg["subjects"] = []string{*subj + ".>"}
		cfg["allow_msg_counter"] = true
		r.Size = 0
		if *window == 0 {
			*window = 500
		}
	default:
		die(r, fmt.Errorf("unknown mode %q", *mode))
	}
	api(nc, "$JS.API.STREAM.DELETE.BENCH", nil)
	if err := api(nc, "$JS.API.STREAM.CREATE.BENCH", cfg); err != nil {
		die(r, err)
	}
	payload := make([]byte, *size)
	for i := range payload {
		payload[i] = byte('a' + i%26)
	}
	per := *n / *pubs
	errs := make(chan error, *pubs)
	var wg sync.WaitGroup
	start := time.Now()
	for p := 0; p < *pubs; p++ {
		pc := connect(*url)
		defer pc.Close()
		wg.Add(1)
		go func(p int, pc *nats.Conn) {
			defer wg.Done()
			var err error
			if *mode == "jsbatch" {
				bid := nuid.Next()
				err = pipeline(pc, per / *batch, *window, func(i int, reply string) error {
					id := bid + strconv.Itoa(i)
					for k := 1; k <= *batch; k++ {
						m := nats.NewMsg(*subj)
						m.Data = payload
						m.Header.Set("Nats-Batch-Id", id)
						m.Header.Set("Nats-Batch-Sequence", strconv.Itoa(k))
						if k == *batch {
							m.Header.Set("Nats-Batch-Commit", "1")
							m.Reply = reply
						}
						if err := pc.PublishMsg(m); err != nil {
							return err
						}
					}
					return nil
				})
			} else {
				err = pipeline(pc, per, *window, func(i int, reply string) error {
					m := nats.NewMsg(*subj + "." + strconv.Itoa((p+i)%*subjects))
					m.Header.Set("Nats-Incr", "+1")
					m.Reply = reply
					return pc.PublishMsg(m)
				})
			}
			errs <- err
		}(p, pc)
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(*timeout):
		die(r, fmt.Errorf("timed out after %s", *timeout))
	}
	el := time.Since(start).Seconds()
	close(errs)
	for err := range errs {
		if err != nil {
			die(r, err)
		}
	}
	total := per * *pubs
	if *mode == "jsbatch" {
		total = per / *batch * *batch * *pubs
	}
	r.Msgs = total
	r.Seconds = el
	r.MsgsPerSec = float64(total) / el
	r.MBPerSec = float64(total*r.Size) / el / 1e6
	b, _ := json.Marshal(r)
	fmt.Println(string(b))
}
