//go:build tools

// Package tools records, for `go mod tidy`, the command built from this module.
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
