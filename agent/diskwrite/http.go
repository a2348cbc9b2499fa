package diskwrite

import (
	"context"
	"fmt"
	"io"
	"net/http"
)

// HTTPFetch returns a Fetch that GETs [off, off+length) of url with a
// Range header and accepts only a 206 whose Content-Range is that range
// (a server ignoring Range would stream the whole image). Write's
// attempts do the retrying.
func HTTPFetch(client *http.Client, url string) Fetch {
	return func(ctx context.Context, off, length int64) (io.ReadCloser, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", off, off+length-1))
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusPartialContent {
			resp.Body.Close()
			return nil, fmt.Errorf("GET %s range %d+%d: %s, want 206", url, off, length, resp.Status)
		}
		var start, end int64
		if _, err := fmt.Sscanf(resp.Header.Get("Content-Range"), "bytes %d-%d/", &start, &end); err != nil || start != off || end != off+length-1 {
			resp.Body.Close()
			return nil, fmt.Errorf("GET %s range %d+%d: Content-Range %q", url, off, length, resp.Header.Get("Content-Range"))
		}
		return resp.Body, nil
	}
}
