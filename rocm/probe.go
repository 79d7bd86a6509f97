package rocm

import (
	"fmt"
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
	var errs []string
	for _, b := range candidates() {
		// The library stays loaded: Open dlopens it again, which then
		// only counts a reference.
		_, err := openDriverLibrary(b)
		if err == nil {
			return nil
		}
		errs = append(errs, err.Error())
	}
	return fmt.Errorf("rocm: no usable GPU: %s: %w", strings.Join(errs, "; "), ErrNoDriver)
}
