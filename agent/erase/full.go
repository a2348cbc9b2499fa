package erase

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// Chunk sizes: each ioctl or write is bounded so ctx is honoured and
// progress reported between them.
const (
	discardChunk = 4 * gib
	zerooutChunk = 256 * mib
	writeChunk   = 4 * mib
	sampleSize   = 4 * kib
)

// full discards the disk when it may (tryDiscard) and samples then read
// back zero, else zeroes it with BLKZEROOUT, else with written zeros;
// then reads back the first and last MiB and Config.Samples random
// blocks.
func (w *work) full(ctx context.Context, tryDiscard bool) (string, error) {
	if tryDiscard {
		err := w.chunks(ctx, "discarding", discardChunk, 0, w.dev.discard)
		switch {
		case err == nil:
			if err := w.dev.flush(); err != nil {
				return "", err
			}
			n, err := w.verify()
			if err == nil {
				return fmt.Sprintf("discarded; %d samples read back zero", n), nil
			}
			if !errors.Is(err, ErrNotZero) {
				return "", err
			}
			// Discard does not promise zeros everywhere.
			w.log.Info("discard left data; zeroing instead", "err", err)
			fmt.Fprintf(w.cfg.Console, "corral: %s: discarded blocks do not all read zero (%v); zeroing\n", w.d.show(), err)
		case ctx.Err() != nil:
			return "", err
		case unsupported(err):
			w.log.Info("discard not supported; zeroing", "err", err)
		default:
			return "", fmt.Errorf("discard (BLKDISCARD): %w", err)
		}
	}
	how := "zeroed"
	var done int64
	err := w.chunks(ctx, "zeroing", zerooutChunk, 0, func(off, n int64) error {
		err := w.dev.zeroout(off, n)
		if err == nil {
			done = off + n
		}
		return err
	})
	if err != nil && unsupported(err) && ctx.Err() == nil {
		w.log.Info("zeroout not supported; writing zeros", "err", err, "from", done)
		how = "zeros written"
		zero := make([]byte, writeChunk)
		err = w.chunks(ctx, "writing zeros", writeChunk, done, func(off, n int64) error {
			_, err := w.dev.WriteAt(zero[:n], off)
			return err
		})
	}
	if err != nil {
		return "", fmt.Errorf("%s: %w", how, err)
	}
	if err := w.dev.flush(); err != nil {
		return "", err
	}
	n, err := w.verify()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s; %d samples read back zero", how, n), nil
}

// chunks calls do over [from, size) in chunks of at most chunk bytes,
// reporting "<what>, N GiB of M GiB" at most every ProgressEvery. It stops
// at the first error or when ctx ends.
func (w *work) chunks(ctx context.Context, what string, chunk, from int64, do func(off, n int64) error) error {
	w.report(what)
	w.last = time.Now()
	for off := from; off < w.d.size; off += chunk {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := min(chunk, w.d.size-off)
		if err := do(off, n); err != nil {
			return err
		}
		w.tick(fmt.Sprintf("%s, %s of %s", what, gibs(off+n), gibs(w.d.size)))
	}
	return nil
}

// gibs is a size in whole GiB ("12 GiB"), or in MiB below 1 GiB.
func gibs(n int64) string {
	if n < gib {
		return fmt.Sprintf("%d MiB", n/mib)
	}
	return fmt.Sprintf("%d GiB", n/gib)
}

// verify reads back the first and last MiB and Config.Samples random
// 4 KiB blocks and says how many samples it read.
func (w *work) verify() (int, error) {
	size := w.d.size
	var samples []extent
	samples = append(samples, extent{0, min(mib, size)})
	if size > mib {
		samples = append(samples, extent{size - min(mib, size-mib), min(mib, size-mib)})
	}
	if blocks := size / sampleSize; blocks > 0 {
		for range w.cfg.Samples {
			samples = append(samples, extent{rand.Int64N(blocks) * sampleSize, sampleSize})
		}
	}
	slices.SortFunc(samples, func(a, b extent) int { return int(max(-1, min(1, a.off-b.off))) })
	for _, s := range samples {
		if err := w.checkZero(s); err != nil {
			return 0, err
		}
	}
	return len(samples), nil
}

// checkZero reads r back and wraps ErrNotZero, naming the first non-zero
// byte, when it does not read zero.
func (w *work) checkZero(r extent) error {
	buf := make([]byte, r.n)
	if _, err := w.dev.ReadAt(buf, r.off); err != nil {
		return fmt.Errorf("read back %s at %d: %w", humanSize(r.n), r.off, err)
	}
	for i, b := range buf {
		if b != 0 {
			return fmt.Errorf("%w: byte %d is %#02x", ErrNotZero, r.off+int64(i), b)
		}
	}
	return nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// unsupported reports whether err says the device cannot do what was
// asked (rather than that it failed doing it).
func unsupported(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS)
}
