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
	fmt.Fprintln(tw, "shape\tn\tclient\ttime\tx oracle\trefused\trefused after 1 min\trequests sent\tserver received\tlearned/s\tallowed/s\t\t")
	for _, c := range cases {
		o := oracle[fmt.Sprintf("%s/%d", c.shape.Name, c.n)]
		ratio := "-"
		if o > 0 {
			ratio = fmt.Sprintf("%.2f", c.elapsed.Seconds()/o.Seconds())
		}
		late := "-" // nothing sent after the first minute
		if c.late > 0 {
			late = fmt.Sprintf("%.1f%% (%d of %d)", 100*float64(c.lateRefused)/float64(c.late), c.lateRefused, c.late)
		}
		status := c.note
		if c.err != nil {
			status = "error: " + c.err.Error()
		}
		learned := "-"
		if c.client == "auditd" {
			learned = fmt.Sprintf("%.3g", c.learned)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%.1fs\t%s\t%s\t%s\t%d\t%d\t%s\t%.3g\t  %s\t\n", c.shape.Name, c.n, c.client,
			c.elapsed.Seconds(), ratio, percent(c.refused, c.sent), late, c.sent, c.received, learned, c.shape.allowed(), status)
	}
	tw.Flush()
}

// percent is n of total as a share.
func percent(n, total int) string {
	if total == 0 {
		return "0%"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(total))
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
