package main

import (
	"net"
	"strconv"

	"github.com/urfave/cli/v2"
)

// serveAddr is the listen address: --addr HOST:PORT, or llama.cpp's
// --host and --port (each defaulting to --addr's default part). Both ways
// at once is a usage error rather than a silent choice.
func serveAddr(c *cli.Context) (string, error) {
	hostSet, portSet := c.IsSet("host"), c.IsSet("port")
	if !hostSet && !portSet {
		return c.String("addr"), nil
	}
	if c.IsSet("addr") {
		return "", usageErrorf("serve: --addr and --host/--port both given: use one or the other")
	}
	host, port, err := net.SplitHostPort(c.String("addr")) // the default's parts
	if err != nil {
		return "", usageErrorf("serve: --addr %q: %w", c.String("addr"), err)
	}
	if hostSet {
		host = c.String("host")
		if host == "" {
			return "", usageErrorf("serve: --host is empty")
		}
	}
	if portSet {
		p := c.Int("port")
		if p < 0 || p > 65535 {
			return "", usageErrorf("serve: --port %d: want 0 (any free port) to 65535", p)
		}
		port = strconv.Itoa(p)
	}
	return net.JoinHostPort(host, port), nil
}
