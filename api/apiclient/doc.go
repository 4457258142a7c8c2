// Package apiclient is a Go client of auditd's REST API generated from
// api/openapi.yaml by oapi-codegen, Go's most used generator. Only tests
// use it (fetch/client_gen_test.go drives runs with it): it proves the
// contract serves client generators as well as the server.
//
// Regenerate it with `go generate ./api/apiclient` after changing the
// contract. oapi-codegen is pinned in go.mod's tool block, so the output
// depends on the module graph alone; make lint regenerates the client into
// a temporary file with the same flags (the Makefile's CLIENTGEN) and fails
// when it differs from client.gen.go.
package apiclient

//go:generate go tool oapi-codegen -generate types,client -package apiclient -o client.gen.go ../openapi.yaml
