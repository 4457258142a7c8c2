package main

import (
	"fmt"
	"io"
	"net"
	"text/tabwriter"
	"time"
)

func report(out io.Writer, cases []*bcase, ns []int) {
	oracle := map[string]time.Duration{}
	for _, c := range cases {
		if c.client == "oracle" {
			oracle[fmt.Sprintf("%s/%d", c.shape.Name, c.n)] = c.elapsed
		}
	}
	tw := tabwriter.NewWriter(out, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "shape\tn\tclient\ttime\tx oracle\trefused\trequests sent\tserver received\tlearned/s\tallowed/s\t\t")
	for _, c := range cases {
		o := oracle[fmt.Sprintf("%s/%d", c.shape.Name, c.n)]
		ratio := "-"
		if o > 0 {
			ratio = fmt.Sprintf("%.2f", c.elapsed.Seconds()/o.Seconds())
		}
		share := 0.0
		if c.sent > 0 {
			share = 100 * float64(c.refused) / float64(c.sent)
		}
		status := c.note
		if c.err != nil {
			status = "error: " + c.err.Error()
		}
		learned := "-"
		if c.client == "auditd" {
			learned = fmt.Sprintf("%.3g", c.learned)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%.1fs\t%s\t%.1f%%\t%d\t%d\t%s\t%.3g\t  %s\t\n", c.shape.Name, c.n, c.client,
			c.elapsed.Seconds(), ratio, share, c.sent, c.received, learned, c.shape.allowed(), status)
	}
	tw.Flush()
}

// usedPorts are the ports freePort has handed out: the kernel may hand a
// closed one out again.
var usedPorts = map[int]bool{}

func freePort() (int, error) {
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if !usedPorts[port] {
			usedPorts[port] = true
			return port, nil
		}
	}
}
