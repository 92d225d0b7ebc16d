package bench

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestLineClockTimesEachLineFromItsStamp(t *testing.T) {
	c := newLineClock()
	stamp := time.Now().Add(-time.Second).UnixNano()
	var script strings.Builder
	for range liveLines {
		fmt.Fprintf(&script, "live %d\n", stamp)
	}
	all := script.String()
	// Lines arrive cut anywhere, as the starter writes what each heartbeat adds.
	c.Write([]byte(all[:7]))
	c.Write([]byte(all[7:]))
	select {
	case <-c.all:
	default:
		t.Fatal("all lines arrived, but all is not closed")
	}
	got, err := c.latencies()
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range got {
		if d < time.Second {
			t.Fatalf("line %d: latency %v, want at least the second since its stamp", i+1, d)
		}
	}
}

func TestLineClockRefusesARepeatedLine(t *testing.T) {
	c := newLineClock()
	for i := range liveLines + 1 {
		fmt.Fprintf(c, "live %d\n", 1000+min(i, liveLines-1))
	}
	if _, err := c.latencies(); err == nil {
		t.Fatal("a line printed twice went unnoticed")
	}
}
