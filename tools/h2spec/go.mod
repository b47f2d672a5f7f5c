// The h2spec conformance tool, pinned with all its dependencies (it has no
// go.mod of its own, so `go install ...@version` would take the newest of
// each): tests/e2e builds it from here and runs it against every server.
module github.com/gymfleet/gymfleet/tools/h2spec

go 1.26.0

tool github.com/summerwind/h2spec/cmd/h2spec

require (
	github.com/fatih/color v1.19.0 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/mattn/go-colorable v0.1.14 // indirect
	github.com/mattn/go-isatty v0.0.20 // indirect
	github.com/spf13/cobra v1.10.2 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
	github.com/summerwind/h2spec v2.2.1+incompatible // indirect
	golang.org/x/net v0.63.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/text v0.44.0 // indirect
)
