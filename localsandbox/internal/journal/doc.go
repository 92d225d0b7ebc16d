// Package journal is the output journal of one process: what the server
// keeps of a command's stdout and stderr, in bounded memory, for the
// readers that attach to it (the connect stream, an exec's answer).
//
//	j := journal.New(1<<20, 10*time.Second)  // 1 MiB held; a stalled reader gets 10 s
//	go func() { j.Append(journal.Stdout, chunk); …; j.SetExit(journal.ExitStatus{Code: 0}) }()
//
//	c, err := j.Attach(after)                // err is ErrExpired: entries after `after` are gone (410)
//	defer j.Detach(c)
//	for {
//		b := j.Take(c, buf, 256<<10)
//		switch {
//		case b.Err != nil:       // the reader stalled and was expired: output_offset_expired
//		case b.Exit != nil:      // every entry before the exit was taken: the stream ends
//		case len(b.Entries) > 0: // send them
//		default:
//			<-b.Wait             // until there is more
//		}
//	}
//
// Entries are numbered 1, 2, 3… across both streams, one per pipe read (at
// most MaxChunk bytes). Where the journal evicts: Append, once the entries
// held pass the journal's cap, drops the oldest — but not one an attached
// reader still needs while that reader makes progress: then Append waits
// (and with it the pump, and the command's pipe fills). A reader that made
// no progress for the stall timeout is expired (blockedFor), and the
// eviction goes on. Release turns that wait off for a tree being killed.
// So a reader that keeps up never loses output, a stuck one cannot hold
// the command up for long, and the journal holds at most its cap plus one
// batch per reader.
//
// The exit is recorded after the output the main process wrote before it
// exited (the pump drains the pipes first): a reader gets every entry
// before the exit, then the exit.
package journal
