package bench

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"time"

	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// MiB is a mebibyte.
const MiB = 1 << 20

// generator is a shell pipeline that writes exactly n bytes of text to
// its stdout, multi-byte characters included (which frames cut apart).
func generator(n int64) string {
	return fmt.Sprintf("yes 'output line: naïve café ✓ 😀' | head -c %d", n)
}

// outputCommand is a command that writes n bytes of text.
func outputCommand(n int64) sandbox.Command {
	return sandbox.Command{Argv: []string{"sh", "-c", generator(n)}}
}

// checkOutputResult checks the Result of outputCommand: it succeeded and
// kept the tail of its output.
func checkOutputResult(res workflows.Result, n int64) error {
	want := min(n, createos.DefaultCaptureBytes)
	if int64(len(res.Stdout)) < want-4 || res.Truncated != (n > createos.DefaultCaptureBytes) {
		return fmt.Errorf("%d bytes of output: the result kept %d bytes (truncated %v)", n, len(res.Stdout), res.Truncated)
	}
	return nil
}

// Streaming is P3's rate: MB/s of RunCommand of a command that writes n
// bytes to stdout, through the full stack (sandbox → server journal →
// NDJSON stream → provider), timed from start to result; beside the same
// generator read by this process through a pipe (`… | cat`). Runs are
// interleaved; the row gives the medians of runs of each.
func Streaming(ctx context.Context, env *Env, n int64, runs int) ([]Row, error) {
	var stack, pipe []time.Duration
	for range runs {
		s, err := timed(func() error {
			res, err := env.runCommand(ctx, env.TaskQueue, "p3", workflows.Request{Command: outputCommand(n)})
			if err != nil {
				return err
			}
			return checkOutputResult(res, n)
		})
		if err != nil {
			return nil, err
		}
		p, err := timed(func() error { return pipeRead(ctx, n) })
		if err != nil {
			return nil, err
		}
		stack, pipe = append(stack, s), append(pipe, p)
	}
	rate := func(d time.Duration) Value { return Value{float64(n) / 1e6 / d.Seconds(), "MB/s"} }
	env.Logf("P3: %d MiB of stdout: full stack %v, pipe %v", n/MiB, Quantile(stack, 0.5), Quantile(pipe, 0.5))
	return []Row{{
		Name:      fmt.Sprintf("P3 streaming: %d MiB of stdout, full stack", n/MiB),
		Figure:    rate(Quantile(stack, 0.5)),
		FloorName: "`cat` through a pipe",
		Floor:     rate(Quantile(pipe, 0.5)),
		Target:    Target{MinRatio: 0.2},
	}}, nil
}

// pipeRead reads the generator's n bytes through `| cat` and a pipe.
func pipeRead(ctx context.Context, n int64) error {
	cmd := exec.CommandContext(ctx, "sh", "-c", generator(n)+" | cat")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	got, err := readAll(out)
	if werr := cmd.Wait(); err == nil {
		err = werr
	}
	if err == nil && got != n {
		err = fmt.Errorf("read %d bytes, want %d", got, n)
	}
	if err != nil {
		return fmt.Errorf("pipe floor: %w", err)
	}
	return nil
}

// readAll reads r to its end and counts the bytes, with a buffer as large
// as cat's own (io.Copy would read 8 or 32 KiB at a time and lower the
// floor).
func readAll(r io.Reader) (int64, error) {
	buf := make([]byte, 128<<10)
	var total int64
	for {
		n, err := r.Read(buf)
		total += int64(n)
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}
