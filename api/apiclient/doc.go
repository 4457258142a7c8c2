// Package apiclient is a Go client of auditd's REST API generated from
// api/openapi.yaml by oapi-codegen, Go's most used generator. Only tests
// use it (fetch/client_gen_test.go drives runs with it): it proves the
// contract serves client generators as well as the server. Regenerate it
// with `go generate ./api/apiclient` after changing the contract.
package apiclient

//go:generate go run github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen@v2.8.2 -generate types,client -package apiclient -o client.gen.go ../openapi.yaml
