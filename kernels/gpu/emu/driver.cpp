// driver.cpp: runs a job file of kernel launches on the wavefront emulator
// (wave.h) and writes the buffers back. Linked with one object per kernel
// module. Usage: driver JOB OUT
//
// JOB, little endian: "WEMU" u32 nbuf, per buffer u64 size and its bytes;
// u32 nlaunch, per launch u32 namelen, name, u32 grid[3], u32 block[3],
// u32 nargs, per argument a kind byte: 'p' u32 buffer u64 byte offset,
// 'n' a null pointer, 'i' i32, 'f' f32.
// OUT: per buffer its bytes (sizes as in JOB), then per launch the u64
// count of shuffle reads from inactive lanes.
// Each buffer is followed by 256 guard bytes; a kernel that writes into
// them fails the job (exit 3).
#include "wave.h"

#include <string>
#include <vector>

#if EMU_ASM_FIBERS
// emu_switch(save, sp): push the callee-saved registers, store the stack
// pointer in *save, continue on the stack sp (as left by emu_switch or set
// up by emu::start), pop its registers and return there.
__asm__(
    ".text\n"
    ".globl emu_switch\n"
    ".type emu_switch,@function\n"
    "emu_switch:\n"
    "  pushq %rbp\n"
    "  pushq %rbx\n"
    "  pushq %r12\n"
    "  pushq %r13\n"
    "  pushq %r14\n"
    "  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n"
    "  popq %r14\n"
    "  popq %r13\n"
    "  popq %r12\n"
    "  popq %rbx\n"
    "  popq %rbp\n"
    "  ret\n"
    ".size emu_switch, .-emu_switch\n");
#endif

namespace {

FILE* in;
void rd(void* p, size_t n) {
  if (fread(p, 1, n, in) != n) {
    fprintf(stderr, "emu: job file truncated\n");
    exit(2);
  }
}
template <class T>
T rd() {
  T v;
  rd(&v, sizeof v);
  return v;
}

constexpr size_t kGuard = 256;
constexpr unsigned char kGuardByte = 0xA5;

struct Call {
  void (*fn)(const emu::Arg*);
  const emu::Arg* args;
};
void body(void* p) {
  Call* c = (Call*)p;
  c->fn(c->args);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s JOB OUT\n", argv[0]);
    return 2;
  }
  in = fopen(argv[1], "rb");
  if (!in) {
    perror(argv[1]);
    return 2;
  }
  char magic[4];
  rd(magic, 4);
  if (memcmp(magic, "WEMU", 4) != 0) {
    fprintf(stderr, "emu: not a job file\n");
    return 2;
  }
  uint32_t nbuf = rd<uint32_t>();
  std::vector<unsigned char*> bufs(nbuf);
  std::vector<uint64_t> sizes(nbuf);
  for (uint32_t i = 0; i < nbuf; i++) {
    sizes[i] = rd<uint64_t>();
    size_t alloc = (sizes[i] + kGuard + 255) & ~size_t(255);
    bufs[i] = (unsigned char*)aligned_alloc(256, alloc);
    rd(bufs[i], sizes[i]);
    memset(bufs[i] + sizes[i], kGuardByte, alloc - sizes[i]);
  }
  uint32_t nl = rd<uint32_t>();
  std::vector<uint64_t> poison(nl);
  for (uint32_t l = 0; l < nl; l++) {
    std::string name(rd<uint32_t>(), '\0');
    rd(name.data(), name.size());
    emu::dim3 grid, block;
    grid.x = rd<uint32_t>(), grid.y = rd<uint32_t>(), grid.z = rd<uint32_t>();
    block.x = rd<uint32_t>(), block.y = rd<uint32_t>(), block.z = rd<uint32_t>();
    uint32_t na = rd<uint32_t>();
    std::vector<emu::Arg> args(na);
    for (auto& a : args) {
      a = emu::Arg{};
      switch (rd<char>()) {
        case 'p': {
          uint32_t b = rd<uint32_t>();
          uint64_t off = rd<uint64_t>();
          if (b >= nbuf || off > sizes[b]) {
            fprintf(stderr, "emu: %s: argument names buffer %u offset %llu\n", name.c_str(), b, (unsigned long long)off);
            return 2;
          }
          a.p = bufs[b] + off;
          break;
        }
        case 'n':
          break;
        case 'i':
          a.i = rd<int32_t>();
          break;
        case 'f':
          a.f = rd<float>();
          break;
        default:
          fprintf(stderr, "emu: bad argument kind\n");
          return 2;
      }
    }
    emu::Entry* e = emu::Entry::head();
    while (e && name != e->name) e = e->next;
    if (!e) {
      fprintf(stderr, "emu: no kernel %s\n", name.c_str());
      return 2;
    }
    if ((uint32_t)e->nargs != na) {
      fprintf(stderr, "emu: %s takes %d arguments, the job gives %u\n", name.c_str(), e->nargs, na);
      return 2;
    }
    Call c{e->fn, args.data()};
    poison[l] = emu::launch(grid, block, body, &c);
    for (uint32_t i = 0; i < nbuf; i++) {
      size_t alloc = (sizes[i] + kGuard + 255) & ~size_t(255);
      for (size_t j = sizes[i]; j < alloc; j++)
        if (bufs[i][j] != kGuardByte) {
          fprintf(stderr, "emu: %s wrote %zu bytes past the end of buffer %u\n", name.c_str(), j - sizes[i], i);
          return 3;
        }
    }
  }
  FILE* out = fopen(argv[2], "wb");
  if (!out) {
    perror(argv[2]);
    return 2;
  }
  for (uint32_t i = 0; i < nbuf; i++) fwrite(bufs[i], 1, sizes[i], out);
  fwrite(poison.data(), 8, nl, out);
  if (fclose(out) != 0) {
    perror(argv[2]);
    return 2;
  }
  return 0;
}
