// Package openapi holds the OpenAPI v2 document of the REST API, generated
// by protoc-gen-openapiv2 from the google.api.http rules in api/**.proto
// (buf.gen.yaml; config.yaml adds the Bearer security and the title) and
// checked in: `make check-generate` fails when it drifts from the protos.
// It imports nothing.
package openapi

import _ "embed"

// JSON is the document (Swagger 2.0, JSON), as served at GET /openapi.json.
//
//go:embed corral.swagger.json
var JSON []byte
