package rest

import (
	"net/http"
	"net/http/httptest"
)

func httptestRequest(accept string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/v1/watch/machines", nil)
	if accept != "" {
		r.Header.Set("Accept", accept)
	}
	return r
}
