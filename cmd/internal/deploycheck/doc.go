// Package deploycheck checks deploy/ against the code, in tests only: the
// Kubernetes manifests are rendered with kustomize and decoded strictly
// into the Kubernetes API types, every server configuration they carry is
// loaded by the servers' own loaders, and the monitoring files are parsed
// by Prometheus's and checked against the metrics the servers register.
// Every pkg/ and cmd/ path the docs, README.md and deploy/ name must
// exist. A manifest, rule, panel or path that drifts from the code fails
// `make test`.
package deploycheck
