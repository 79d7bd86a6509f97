package pipeline

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/forge-llm/forge/actors"
	"github.com/forge-llm/forge/gguf"
)

// A mixture's experts load after every block (actors.Plan), by index
// unless a usage profile of the same file says which experts requests
// routed to in earlier runs: then the most used load first, so a first
// token (which waits for the experts its prompt routes to) more often
// finds them resident. Options.ExpertProfiles names the folder of
// profiles; each is one file's, keyed by the file's identity, and every
// model opened with it adds its own use at Close: how many tokens the
// router sent to each expert (the mixture op counts them, so requests of
// the single-request executor and of the batching scheduler both count).

// expertProfile is one file's record of use: Uses[l][e] is how many
// tokens were routed to expert e of block l. (Profiles written before
// the mixture op counted held requests instead; only their order is
// used, so they still order a load.)
type expertProfile struct {
	Identity string    `json:"identity"`
	Uses     [][]int64 `json:"uses"`
}

// profileSample is how many bytes of each block's router go into a file's
// identity: the router decides where tokens go, so two files with the
// same index and the same routers route alike.
const profileSample = 4096

// fileIdentity names a model file's routing for its profile: a SHA-256 of
// the file's size, its tensor index (names, types, shapes, offsets) and
// the first bytes of every router (ffn_gate_inp). Not the whole file: a
// multi-GB hash would cost more than the load it orders. A copy or a
// rename keeps the identity; a file with other routers gets another.
func fileIdentity(f *gguf.File) (string, error) {
	h := sha256.New()
	var b [8]byte
	put := func(v uint64) { binary.LittleEndian.PutUint64(b[:], v); h.Write(b[:]) }
	put(uint64(f.Size))
	for i := range f.Tensors {
		t := &f.Tensors[i]
		h.Write([]byte(t.Name))
		put(uint64(t.Type))
		put(t.Offset)
		for _, d := range t.Dims {
			put(d)
		}
		if _, inBlock, _ := gguf.BlockOf(t.Name); inBlock && strings.HasSuffix(t.Name, ".ffn_gate_inp.weight") {
			data, err := f.TensorData(t)
			if err != nil {
				return "", err
			}
			var sample []byte
			if err := gguf.CatchFault(func() { sample = append(sample, data[:min(len(data), profileSample)]...) }); err != nil {
				return "", err
			}
			h.Write(sample)
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:16]), nil
}

// profilePath is where the profile of identity id lives in dir.
func profilePath(dir, id string) string { return filepath.Join(dir, "experts-"+id+".json") }

// loadProfile reads the profile of id from dir: nil (no error) when there
// is none yet.
func loadProfile(dir, id string) (*expertProfile, error) {
	b, err := os.ReadFile(profilePath(dir, id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pipeline: expert profile: %w", err)
	}
	var p expertProfile
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("pipeline: expert profile %s: %w", profilePath(dir, id), err)
	}
	if p.Identity != id {
		return nil, fmt.Errorf("pipeline: expert profile %s is of file %s", profilePath(dir, id), p.Identity)
	}
	return &p, nil
}

// uses is how many tokens were routed to expert e of block l.
func (p *expertProfile) uses(l, e int) int64 {
	if p == nil || l < 0 || l >= len(p.Uses) || e < 0 || e >= len(p.Uses[l]) {
		return 0
	}
	return p.Uses[l][e]
}

// profileOrder is the load order base (nil: the plan's) with the expert
// units, which come after every block, in two parts. First the hot
// experts: those its block's tokens were routed to at least half as often
// as an even spread over the block's experts would give (every expert
// that a profile of one prompt's run holds), block by block, so that a
// prompt's first blocks run while later blocks' experts still arrive
// (sorted by use alone, the last block's experts came as early as the
// first's, and the prompt's blocks all waited for the last one routed).
// Then the others, most used first. Ties keep the base order (by block
// and index).
func profileOrder(base func(*actors.Plan) []*actors.Unit, prof *expertProfile) func(*actors.Plan) []*actors.Unit {
	return func(p *actors.Plan) []*actors.Unit {
		units := p.Units
		if base != nil {
			units = base(p)
		}
		units = slices.Clone(units)
		head := 0
		for head < len(units) && !units[head].IsExpert() {
			head++
		}
		hot := func(u *actors.Unit) bool { return prof.hot(u.Layer, u.Expert) }
		slices.SortStableFunc(units[head:], func(a, b *actors.Unit) int {
			ha, hb := hot(a), hot(b)
			switch {
			case ha && hb:
				return cmp.Compare(a.Layer, b.Layer)
			case ha != hb:
				if ha {
					return -1
				}
				return 1
			}
			return cmp.Compare(prof.uses(b.Layer, b.Expert), prof.uses(a.Layer, a.Expert))
		})
		return units
	}
}

// hot reports whether block l's tokens reached expert e at least half as
// often as an even spread over the block's experts would.
func (p *expertProfile) hot(l, e int) bool {
	u := p.uses(l, e)
	if u <= 0 {
		return false
	}
	var total int64
	for _, v := range p.Uses[l] {
		total += v
	}
	return 2*u*int64(len(p.Uses[l])) >= total
}

// saveProfile adds this model's routing (how many tokens the router sent
// to each expert, single requests' and batched steps' alike) to the
// profile of id in dir; nothing when no token was routed.
func (m *Model) saveProfile(dir, id string) error {
	add := make([][]int64, m.cfg.Layers)
	used := false
	for l := range add {
		add[l] = make([]int64, m.sys.Experts(l))
		for e := range add[l] {
			add[l][e] = m.sys.ExpertUses(l, e)
			used = used || add[l][e] > 0
		}
	}
	if !used {
		return nil
	}
	return addToProfile(dir, id, add)
}

// profileMu serialises this process's profile writes; lockProfile (a lock
// file) serialises processes'.
var profileMu sync.Mutex

// addToProfile adds add[l][e] to the uses of the profile of id in dir
// (made if new). Two models may close at once on the same file, in one
// process (an engine's) or two: each re-reads the profile under the lock,
// merges its counts and writes the whole to a temporary file of its own,
// renamed over the old one, so neither's counts are lost and a reader
// never sees half a profile.
func addToProfile(dir, id string, add [][]int64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("pipeline: expert profile: %w", err)
	}
	path := profilePath(dir, id)
	profileMu.Lock()
	defer profileMu.Unlock()
	unlock, err := lockProfile(path + ".lock")
	if err != nil {
		return fmt.Errorf("pipeline: expert profile %s: %w", path, err)
	}
	defer unlock()
	prof, err := loadProfile(dir, id)
	if err != nil {
		slog.Warn("pipeline: a damaged expert usage profile is replaced", "path", path, "err", err)
		prof = nil
	}
	if prof == nil {
		prof = &expertProfile{Identity: id}
	}
	for len(prof.Uses) < len(add) {
		prof.Uses = append(prof.Uses, nil)
	}
	for l, row := range add {
		for len(prof.Uses[l]) < len(row) {
			prof.Uses[l] = append(prof.Uses[l], 0)
		}
		for e, k := range row {
			prof.Uses[l][e] += k
		}
	}
	b, err := json.Marshal(prof)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "experts-"+id+"-*.tmp")
	if err != nil {
		return fmt.Errorf("pipeline: expert profile: %w", err)
	}
	_, err = tmp.Write(b)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("pipeline: expert profile: %w", err)
	}
	return nil
}

// expertOrder is the load order Open gives the actors for a mixture of
// experts opened with ExpertProfiles: its profile's, when one exists (nil:
// the plan's, by index), and the file's identity to record the use under
// (""  when not recording). A profile that can not be read is logged and
// left out: it only orders the load.
func expertOrder(o Options, f *gguf.File, experts int) (func(*actors.Plan) []*actors.Unit, string) {
	if o.ExpertProfiles == "" || experts == 0 {
		return nil, ""
	}
	id, err := fileIdentity(f)
	if err != nil {
		slog.Warn("pipeline: no expert usage profile", "model", f.Path, "err", err)
		return nil, ""
	}
	prof, err := loadProfile(o.ExpertProfiles, id)
	if err != nil {
		slog.Warn("pipeline: expert usage profile ignored", "model", f.Path, "err", err)
	}
	if prof == nil {
		return nil, id
	}
	return profileOrder(nil, prof), id
}
