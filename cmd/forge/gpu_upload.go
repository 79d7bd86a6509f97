package main

import (
	"github.com/urfave/cli/v2"

	"github.com/forge-llm/forge/kernels/gpu"
	"github.com/forge-llm/forge/pipeline"
)

// gpuUploadFlag sets the GPU uploader's helpers for one process (forge
// run, forge serve, forge bench load): a benchmark knob, hidden from
// help, that replaced the FORGE_GPU_UPLOAD environment variable.
func gpuUploadFlag() cli.Flag {
	return &cli.StringFlag{Name: "gpu-upload", Hidden: true,
		Usage: "GPU uploader settings, comma-separated: reg, st=stagers, rn=ring buffers, rs=ring MiB, rt=registration threads, rb=registration MiB"}
}

// gpuUpload reads --gpu-upload (the zero tuning when absent: the
// uploader's measured defaults).
func gpuUpload(c *cli.Context) (pipeline.UploadTuning, error) {
	t, err := pipeline.UploadTuning{}.Parse(c.String("gpu-upload"))
	if err != nil {
		return t, usageErrorf("--gpu-upload %q: %v", c.String("gpu-upload"), err)
	}
	return t, nil
}

// gpuMMQFlag chooses the GPU's int8 tensor-core kernels (forge run, forge
// serve, forge bench gen, forge perplexity): a benchmark knob, hidden from help, that
// replaced the FORGE_GPU_NO_MMQ and FORGE_GPU_MMQ_VARIANT environment
// variables.
func gpuMMQFlag() cli.Flag {
	return &cli.StringFlag{Name: "gpu-mmq", Hidden: true,
		Usage: "the GPU's int8 tensor-core kernels for batched rows: off, or variants per type such as q4_k=p,q6_k=- or q8_0=q8,q4_0=f16 (prompt products on 8-bit or f16 x; default: the measured best)"}
}

// gpuMMQ reads --gpu-mmq, refusing a setting gpu.ParseMMQ does not take.
func gpuMMQ(c *cli.Context) (string, error) {
	s := c.String("gpu-mmq")
	if _, _, err := gpu.ParseMMQ(s); err != nil {
		return "", usageErrorf("--gpu-mmq %q: %v", s, err)
	}
	return s, nil
}
