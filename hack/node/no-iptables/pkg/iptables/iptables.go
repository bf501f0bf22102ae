// Package iptables is the part of sigs.k8s.io/iptables-wrappers' API that the 1.38 kubelet calls
// (pkg/kubelet/kubelet_network_linux.go), for a node that has no iptables: NewBestEffort finds
// none, so the kubelet creates no chains. Nothing else of Kubernetes that migdra's tests build
// imports it.
package iptables

import (
	"context"
	"time"
)

// Table is an iptables table.
type Table string

// The tables the kubelet names.
const (
	TableNAT    Table = "nat"
	TableFilter Table = "filter"
	TableMangle Table = "mangle"
)

// Chain is an iptables chain.
type Chain string

// The built-in chains the kubelet names.
const (
	ChainInput  Chain = "INPUT"
	ChainOutput Chain = "OUTPUT"
)

// RulePosition says where EnsureRule puts a rule.
type RulePosition string

// The positions the kubelet names.
const (
	Prepend RulePosition = "-I"
	Append  RulePosition = "-A"
)

// Protocol is an IP family.
type Protocol string

// The families.
const (
	ProtocolIPv4 Protocol = "IPv4"
	ProtocolIPv6 Protocol = "IPv6"
)

// Mode says which iptables backend to look for.
type Mode string

// UseInstalledMode looks for whichever backend the host uses.
const UseInstalledMode Mode = "installed"

// Interface is one family's iptables client.
type Interface interface {
	EnsureChain(ctx context.Context, table Table, chain Chain) (bool, error)
	EnsureRule(ctx context.Context, position RulePosition, table Table, chain Chain, args ...string) (bool, error)
	IsIPv6() bool
	Protocol() Protocol
	Monitor(ctx context.Context, canary Chain, tables []Table, reloadFunc func(), interval time.Duration)
}

// NewBestEffort returns a client per family whose iptables works: on this node, none.
func NewBestEffort(_ context.Context, _ Mode) map[Protocol]Interface {
	return map[Protocol]Interface{}
}
