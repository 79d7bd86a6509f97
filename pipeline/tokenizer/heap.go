package tokenizer

// The merge queues are binary min-heaps written out for each element type:
// with a comparison function (or container/heap's interface) every sift step
// is an indirect call, and the queues are the hottest code of Encode. The
// two are the same code with a different "before".

// spmQueue pops the highest score first, the leftmost pair among equals.
type spmQueue []spmBigram

func spmBefore(a, b *spmBigram) bool {
	if a.score != b.score {
		return a.score > b.score
	}
	return a.left < b.left
}

func (q *spmQueue) push(x spmBigram) {
	h := append(*q, x)
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if !spmBefore(&h[i], &h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	*q = h
}

func (q *spmQueue) pop() spmBigram {
	h := *q
	top, n := h[0], len(h)-1
	h[0] = h[n]
	h = h[:n]
	for i := 0; ; {
		m, l, r := i, 2*i+1, 2*i+2
		if l < n && spmBefore(&h[l], &h[m]) {
			m = l
		}
		if r < n && spmBefore(&h[r], &h[m]) {
			m = r
		}
		if m == i {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	*q = h
	return top
}

// bpeQueue pops the lowest merge rank first, the leftmost pair among equals.
type bpeQueue []bpeBigram

func bpeBefore(a, b *bpeBigram) bool {
	if a.rank != b.rank {
		return a.rank < b.rank
	}
	return a.left < b.left
}

func (q *bpeQueue) push(x bpeBigram) {
	h := append(*q, x)
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if !bpeBefore(&h[i], &h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	*q = h
}

func (q *bpeQueue) pop() bpeBigram {
	h := *q
	top, n := h[0], len(h)-1
	h[0] = h[n]
	h = h[:n]
	for i := 0; ; {
		m, l, r := i, 2*i+1, 2*i+2
		if l < n && bpeBefore(&h[l], &h[m]) {
			m = l
		}
		if r < n && bpeBefore(&h[r], &h[m]) {
			m = r
		}
		if m == i {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	*q = h
	return top
}
