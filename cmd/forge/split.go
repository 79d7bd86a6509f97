package main

import (
	"strings"

	"github.com/forge-llm/forge/pipeline"
	"github.com/urfave/cli/v2"
)

// deviceUsage is the --device help of the commands that can split a
// model over several GPUs.
const deviceUsage = "auto, cpu, gpu, gpu:N, or gpu:N,M,… / gpu:all (the model split by layers over those GPUs)"

// splitFlag is --split: each GPU's share of the layers of a split model.
func splitFlag() cli.Flag {
	return &cli.StringFlag{Name: "split", Usage: "with --device gpu:N,M,…: each GPU's share of the layers, e.g. 1,1 (default: by free memory)"}
}

// splitShares reads --split, checked against --device.
func splitShares(c *cli.Context) ([]float64, error) {
	s, err := pipeline.ParseSplit(c.String("split"))
	if err != nil {
		return nil, usageErrorf("--split: %w", err)
	}
	if s == nil {
		return nil, nil
	}
	dev := strings.ToLower(c.String("device"))
	if !strings.HasPrefix(dev, "gpu:") || !strings.Contains(dev, ",") {
		if dev == "gpu:all" {
			return s, nil
		}
		return nil, usageErrorf("--split %q needs --device gpu:N,M,… (or gpu:all)", c.String("split"))
	}
	if n := strings.Count(dev, ",") + 1; n != len(s) {
		return nil, usageErrorf("--split %q: %d shares for %d GPUs", c.String("split"), len(s), n)
	}
	return s, nil
}
