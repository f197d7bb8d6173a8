// test_cxx_new.cpp — C++'s operator new and delete under the preloaded library: served by Mallard itself (every form,
// aligned ones aligned), and a new that finds no memory behaves as the C++ runtime's: the new_handler runs and is
// retried, std::bad_alloc is thrown, the nothrow forms return nullptr.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <new>

static int failures;
#define CHECK(cond, ...)                                                    \
  do {                                                                      \
    if (!(cond)) {                                                          \
      std::fprintf(stderr, "FAIL %s:%d: (%s) ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                    \
      std::fprintf(stderr, "\n");                                           \
      failures++;                                                           \
    }                                                                       \
  } while (0)

// Which object defines the operator new the program calls (the preloaded library, or the C++ runtime).
static const char *definer(const char *sym) {
  Dl_info info;
  void *f = dlsym(RTLD_DEFAULT, sym);
  if (!f || !dladdr(f, &info) || !info.dli_fname) return "(none)";
  return info.dli_fname;
}

static bool owns(const void *p) {
  auto f = reinterpret_cast<bool (*)(const void *)>(dlsym(RTLD_DEFAULT, "mallard_owns"));
  return f && f(p);
}

// Opaque to the optimiser: new and delete pairs are not elided.
static void *volatile sink;

struct alignas(256) Wide { unsigned char b[300]; };

static int handler_calls;
static void *reserve;   // freed by the new_handler on its first call: the retried malloc may then succeed
static void handler() {
  handler_calls++;
  if (reserve) { std::free(reserve); reserve = nullptr; return; }
  std::set_new_handler(nullptr);   // nothing more to give: the next failure throws
}

int main() {
  const char *syms[] = { "_Znwm", "_Znam", "_ZnwmRKSt9nothrow_t", "_ZnwmSt11align_val_t", "_ZdlPv", "_ZdlPvm",
                         "_ZdaPv", "_ZdlPvSt11align_val_t" };
  for (const char *s : syms) CHECK(std::strstr(definer(s), "libmallard") != nullptr, "%s is defined by %s", s, definer(s));

  // Every form hands out Mallard's blocks, the aligned ones aligned; each is freed by its delete.
  int *one = new int(7);
  int *arr = new int[1000];
  Wide *w = new Wide;
  Wide *wa = new Wide[3];
  int *nt = new (std::nothrow) int[10];
  Wide *wnt = new (std::nothrow) Wide;
  CHECK(owns(one) && owns(arr) && owns(w) && owns(wa) && owns(nt) && owns(wnt), "a block not from Mallard");
  CHECK(reinterpret_cast<uintptr_t>(w) % 256 == 0 && reinterpret_cast<uintptr_t>(wa) % 256 == 0 &&
            reinterpret_cast<uintptr_t>(wnt) % 256 == 0, "aligned new misaligned: %p %p %p", (void *)w, (void *)wa,
        (void *)wnt);
  sink = one; sink = arr; sink = w; sink = wa;
  delete one;
  delete[] arr;
  delete w;
  delete[] wa;
  delete[] nt;
  delete wnt;
  ::operator delete(::operator new(100), std::size_t(100));   // sized delete
  ::operator delete(::operator new(64, std::align_val_t(64)), std::size_t(64), std::align_val_t(64));

  // No memory: the nothrow forms return nullptr, the others throw std::bad_alloc (no handler installed).
  const std::size_t huge = SIZE_MAX / 2;
  CHECK(::operator new(huge, std::nothrow) == nullptr, "nothrow new of %zu bytes did not return nullptr", huge);
  CHECK(::operator new[](huge, std::nothrow) == nullptr, "nothrow new[] did not return nullptr");
  CHECK(::operator new(huge, std::align_val_t(64), std::nothrow) == nullptr, "aligned nothrow new did not return nullptr");
  bool threw = false;
  try { sink = ::operator new(huge); } catch (const std::bad_alloc &) { threw = true; }
  CHECK(threw, "new of %zu bytes did not throw std::bad_alloc", huge);
  threw = false;
  try { sink = ::operator new[](huge, std::align_val_t(128)); } catch (const std::bad_alloc &) { threw = true; }
  CHECK(threw, "aligned new[] did not throw std::bad_alloc");

  // An alignment that is not a power of two (undefined in C++): refused as the runtime refuses it, nothing handed out.
  CHECK(::operator new(64, std::align_val_t(48), std::nothrow) == nullptr, "nothrow new aligned to 48 did not fail");
  threw = false;
  try { sink = ::operator new(64, std::align_val_t(48)); } catch (const std::bad_alloc &) { threw = true; }
  CHECK(threw, "new aligned to 48 did not throw std::bad_alloc");

  // The new_handler runs on failure and the allocation is retried while it returns; then bad_alloc.
  reserve = std::malloc(1000);
  std::set_new_handler(handler);
  threw = false;
  try { sink = ::operator new(huge); } catch (const std::bad_alloc &) { threw = true; }
  CHECK(threw && handler_calls == 2, "new_handler: threw %d, called %d times (expected 2)", threw, handler_calls);

  std::printf("cxx_new: operator new defined by %s; %d failure(s)\n", definer("_Znwm"), failures);
  return failures ? 1 : 0;
}
