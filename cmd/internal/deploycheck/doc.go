// Package deploycheck checks deploy/ against the code, in tests only: the
// Kubernetes manifests are rendered with kustomize and decoded strictly
// into the Kubernetes API types, every server configuration they carry is
// loaded by the servers' own loaders, and the monitoring files are parsed
// by Prometheus's and checked against the metrics the servers register.
// A manifest, rule or panel that drifts from the code fails `make test`.
package deploycheck
