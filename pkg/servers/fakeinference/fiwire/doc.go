// Package fiwire is the control contract of the fake inference server
// (pkg/servers/fakeinference): the bodies of its /_ctl/ routes, the policy Script
// they set, and Control, a client of those routes and of the generation
// cut. Tests and benchmarks drive a fake through it without linking the
// server.
package fiwire
