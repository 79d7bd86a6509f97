package kernels

import (
	"strings"
	"testing"
)

// TestQ8In: a copy's codes and scales are carved from one tensor, each
// from a 256-byte boundary on, and a view of rows is the same rows' codes
// and scales.
func TestQ8In(t *testing.T) {
	if got := Q8Floats(3, 96); got != 128+64 { // 72 floats of codes, 9 of scales, each rounded up to 64
		t.Errorf("Q8Floats(3, 96) = %d", got)
	}
	buf := Tensor{Len: Q8Floats(3, 96), Host: make([]float32, Q8Floats(3, 96))}
	q, err := Q8In(buf, 3, 96)
	if err != nil {
		t.Fatal(err)
	}
	if q.Codes.Len != 72 || q.Scales.Len != 9 || &q.Scales.Host[0] != &buf.Host[128] {
		t.Errorf("codes %d, scales %d floats at %p (want %p)", q.Codes.Len, q.Scales.Len, &q.Scales.Host[0], &buf.Host[128])
	}
	v := q.View(1, 2)
	if v.Rows != 2 || v.Cols != 96 || &v.Codes.Host[0] != &buf.Host[24] || v.Codes.Len != 48 ||
		&v.Scales.Host[0] != &buf.Host[128+3] || v.Scales.Len != 6 {
		t.Errorf("rows 1…2: %+v", v)
	}
	dev := Tensor{Len: Q8Floats(2, 64), Dev: 4096}
	qd, err := Q8In(dev, 2, 64)
	if err != nil {
		t.Fatal(err)
	}
	if qd.Codes.Dev != 4096 || qd.Scales.Dev != 4096+256 || qd.View(1, 1).Codes.Dev != 4096+64 || qd.View(1, 1).Scales.Dev != 4096+256+8 {
		t.Errorf("device copy: %+v", qd)
	}
	if !(Q8{}).Empty() || q.Empty() || !q.View(0, 0).Empty() || !(Q8{}).View(0, 3).Empty() {
		t.Error("Empty")
	}
	for _, c := range []struct {
		rows, cols, len int
		want            string
	}{{3, 48, 1000, "whole blocks of 32"}, {0, 64, 1000, "rows > 0"}, {3, 96, 100, "needs 192 floats"}} {
		if _, err := Q8In(Tensor{Len: c.len, Host: make([]float32, c.len)}, c.rows, c.cols); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Q8In(%d rows, %d cols, %d floats): err = %v, want %q", c.rows, c.cols, c.len, err, c.want)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("a view past the last row did not panic")
		}
	}()
	q.View(2, 2)
}
