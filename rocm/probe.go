package rocm

import (
	"fmt"
	"os"
	"strings"
)

// Probe reports, without initialising any driver, whether a GPU driver
// library can be loaded: nil if libcuda or libamdhip64 (or the one
// $FORGE_GPU_BACKEND names) opens, else an error matching ErrNoDriver that
// lists where it looked. It costs a dlopen (milliseconds; Open then finds
// the library already loaded), where Open's driver initialisation costs a
// tenth of a second or more: callers that open the device in the
// background use it to fail at once on a machine with no driver.
func Probe() error {
	type lib struct {
		env   string
		names []string
	}
	cuda := lib{EnvCUDALib, []string{"libcuda.so.1", "libcuda.so"}}
	hip := lib{EnvHIPLib, []string{"libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"}}
	libs := []lib{cuda, hip}
	switch strings.ToLower(os.Getenv(EnvBackend)) {
	case "cuda":
		libs = []lib{cuda}
	case "hip", "rocm":
		libs = []lib{hip}
	}
	var errs []string
	for _, l := range libs {
		// The library stays loaded: Open dlopens it again, which then
		// only counts a reference.
		_, err := openLibrary(l.env, l.names...)
		if err == nil {
			return nil
		}
		errs = append(errs, err.Error())
	}
	return fmt.Errorf("rocm: no usable GPU: %s: %w", strings.Join(errs, "; "), ErrNoDriver)
}
