package kernels

// The ops of OpenAI's gpt-oss beyond every backend's set: attention sinks
// (Attn.Sinks) and the clamped SwiGLU of its experts. They are optional
// capabilities: the model refuses a gpt-oss file on a backend without
// them rather than compute something else.

// SinkAttender is a Backend whose Attention and PagedAttention honour
// Attn.Sinks: for query head h, the softmax over the scaled scores s_p is
// taken as if one more score sink[h] were among them,
//
//	w_p = e^(s_p - m) / (Σ_p e^(s_p - m) + e^(sink[h] - m)),  m = max(max_p s_p, sink[h])
//
// and the sink adds no value row: the weights sum to less than 1.
type SinkAttender interface {
	AttentionSinks() bool
}

// SwiGLUOAIer is a Backend with gpt-oss's gated activation.
type SwiGLUOAIer interface {
	// SwiGLUOAI computes over n values
	//
	//	g = min(gate, limit)   u = clamp(up, -limit, limit)
	//	dst = g·σ(alpha·g)·(u + 1)
	//
	// with σ the logistic function.
	SwiGLUOAI(dst, gate, up Tensor, n int, alpha, limit float32) error
}
