#pragma once
// Device memory between processes: the memory backend of features/device_ipc.hpp's peer_group for
// cuda::transport's process-ranks.
//
// Two ways, as NCCL has them:
//   - the VMM API (default where the device supports it): the transport's own memory is made
//     with cuMemCreate, exportable as a POSIX file descriptor, which travels to the peers over
//     the ranks' Unix sockets (SCM_RIGHTS) and is imported, mapped and given access there
//     (cuMemImportFromShareableHandle, cuMemAddressReserve, cuMemMap, cuMemSetAccess);
//   - cudaIpc handles (COLLX_CUDA_IPC=legacy, or where VMM is not supported): cudaMalloc'd memory
//     and its cudaIpcMemHandle_t, opened by the peers with cudaIpcOpenMemHandle.
// A user's buffer is mapped the way its allocation allows: a VMM mapping whose allocation was
// made exportable as a descriptor (PyTorch's expandable segments are), or cudaMalloc memory
// through its cudaIpc handle; anything else (a stream-ordered pool's memory, managed memory) is
// staged through the transport's own memory (features/device_ipc.hpp: stage_buffers), one more pass over
// HBM each way. Allocations are told apart by the driver's ids (a freed buffer's address handed
// out again is another allocation), and a peer keeps the last kMappedPerPeer of a rank mapped.
//
// The driver API is reached through cudaGetDriverEntryPointByVersion, so nothing links
// libcuda: a program built with this runs (and its tests skip) on a machine without a driver.
#if !defined(__CUDACC__)
#error "collx/cuda/*.cuh headers compile only under nvcc"
#endif
#include <cuda.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "../features/device_ipc.hpp"
#include "../core/settings.hpp"
#include "../core/error.hpp"

namespace collx::cuda {

/// Throws transport_error for a failed CUDA call, naming it.
inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw error(errc::transport_error, std::string("collx::cuda: ") + what + ": " + cudaGetErrorString(e));
}

namespace detail {

/// The driver functions the VMM path uses, found once through the runtime.
struct driver {
  CUresult (*memCreate)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long) = nullptr;
  CUresult (*memRelease)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*memAddressReserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*memAddressFree)(CUdeviceptr, size_t) = nullptr;
  CUresult (*memMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) = nullptr;
  CUresult (*memUnmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*memSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*memGetAllocationGranularity)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*memExportToShareableHandle)(void*, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long) = nullptr;
  CUresult (*memImportFromShareableHandle)(CUmemGenericAllocationHandle*, void*, CUmemAllocationHandleType) = nullptr;
  CUresult (*memRetainAllocationHandle)(CUmemGenericAllocationHandle*, void*) = nullptr;
  CUresult (*pointerGetAttributes)(unsigned int, CUpointer_attribute*, void**, CUdeviceptr) = nullptr;
  CUresult (*getErrorString)(CUresult, const char**) = nullptr;
  CUresult (*deviceGet)(CUdevice*, int) = nullptr;
  CUresult (*deviceGetAttribute)(int*, CUdevice_attribute, CUdevice) = nullptr;
  std::string missing;  // the first function not found, if any

  static const driver& get() {
    static const driver d = [] {
      driver x;
      auto find = [&](const char* name, auto& fn) {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult q{};
#if CUDART_VERSION >= 12050
        const cudaError_t e = cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q);
#else  // (the versioned lookup came with CUDA 12.5)
        const cudaError_t e = cudaGetDriverEntryPoint(name, &p, cudaEnableDefault, &q);
#endif
        if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || p == nullptr) {
          if (x.missing.empty()) x.missing = name;
          return;
        }
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
      };
      find("cuMemCreate", x.memCreate);
      find("cuMemRelease", x.memRelease);
      find("cuMemAddressReserve", x.memAddressReserve);
      find("cuMemAddressFree", x.memAddressFree);
      find("cuMemMap", x.memMap);
      find("cuMemUnmap", x.memUnmap);
      find("cuMemSetAccess", x.memSetAccess);
      find("cuMemGetAllocationGranularity", x.memGetAllocationGranularity);
      find("cuMemExportToShareableHandle", x.memExportToShareableHandle);
      find("cuMemImportFromShareableHandle", x.memImportFromShareableHandle);
      find("cuMemRetainAllocationHandle", x.memRetainAllocationHandle);
      find("cuPointerGetAttributes", x.pointerGetAttributes);
      find("cuGetErrorString", x.getErrorString);
      find("cuDeviceGet", x.deviceGet);
      find("cuDeviceGetAttribute", x.deviceGetAttribute);
      return x;
    }();
    return d;
  }
  void check(CUresult r, const char* what) const {
    if (r == CUDA_SUCCESS) return;
    const char* s = nullptr;
    if (getErrorString) getErrorString(r, &s);
    throw error(errc::transport_error, std::string("collx::cuda: ") + what + ": " + (s ? s : "error " + std::to_string(int(r))));
  }
};

}  // namespace detail

/// How the transport's own memory reaches the peers: COLLX_CUDA_IPC=vmm, legacy, or auto (vmm
/// where the device supports VMM with POSIX descriptors, else legacy).
enum class ipc_mode { automatic, vmm, legacy };
inline ipc_mode ipc_mode_from_env() {
  const std::string v = collx::detail::env_string("COLLX_CUDA_IPC", "auto");
  if (v == "auto") return ipc_mode::automatic;
  if (v == "vmm") return ipc_mode::vmm;
  if (v == "legacy") return ipc_mode::legacy;
  throw error(errc::invalid_argument, "COLLX_CUDA_IPC must be auto, vmm or legacy, not \"" + v + "\"");
}

/// features/device_ipc.hpp's memory backend for device memory (see the top).
class ipc_backend {
 public:
  struct owned {
    std::byte* p = nullptr;
    std::size_t bytes = 0;  // as mapped (VMM: whole granules)
    CUmemGenericAllocationHandle h = 0;
  };

  explicit ipc_backend(int device, ipc_mode mode = ipc_mode_from_env()) : dev_(device) {
    check(cudaSetDevice(dev_), "cudaSetDevice");
    const detail::driver& d = detail::driver::get();
    int vmm = 0, fd = 0;
    CUdevice cu = 0;
    if (d.missing.empty() && d.deviceGet(&cu, dev_) == CUDA_SUCCESS) {
      d.deviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, cu);
      d.deviceGetAttribute(&fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, cu);
    }
    const bool can = vmm != 0 && fd != 0 && d.missing.empty();
    if (mode == ipc_mode::vmm && !can)
      throw error(errc::invalid_argument, "COLLX_CUDA_IPC=vmm: device " + std::to_string(dev_) +
                                              " has no VMM with POSIX descriptors (or the driver lacks " +
                                              detail::driver::get().missing + ")");
    vmm_ = mode == ipc_mode::vmm || (mode == ipc_mode::automatic && can);
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, dev_), "cudaGetDeviceProperties");
    std::memcpy(uuid_.data(), &prop.uuid, 16);
  }

  bool vmm() const noexcept { return vmm_; }
  int device() const noexcept { return dev_; }
  const char* kind_name() const noexcept { return vmm_ ? "cuda VMM, POSIX descriptors" : "cudaIpc handles"; }
  std::array<std::uint8_t, 16> device_id() const { return uuid_; }

  owned allocate(std::size_t bytes) {
    check(cudaSetDevice(dev_), "cudaSetDevice");
    owned o;
    if (vmm_) {
      const detail::driver& d = detail::driver::get();
      const CUmemAllocationProp prop = props();
      std::size_t g = 0;
      d.check(d.memGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), "cuMemGetAllocationGranularity");
      o.bytes = (std::max<std::size_t>(bytes, 1) + g - 1) / g * g;
      d.check(d.memCreate(&o.h, o.bytes, &prop, 0), "cuMemCreate");
      CUdeviceptr va = 0;
      if (const CUresult r = d.memAddressReserve(&va, o.bytes, g, 0, 0); r != CUDA_SUCCESS) {
        d.memRelease(o.h);
        d.check(r, "cuMemAddressReserve");
      }
      CUresult r = d.memMap(va, o.bytes, 0, o.h, 0);
      if (r == CUDA_SUCCESS) {
        const CUmemAccessDesc a = access();
        r = d.memSetAccess(va, o.bytes, &a, 1);
        if (r != CUDA_SUCCESS) d.memUnmap(va, o.bytes);
      }
      if (r != CUDA_SUCCESS) {
        d.memAddressFree(va, o.bytes);
        d.memRelease(o.h);
        d.check(r, "cuMemMap / cuMemSetAccess");
      }
      o.p = reinterpret_cast<std::byte*>(va);
    } else {
      o.bytes = std::max<std::size_t>(bytes, 1);
      void* p = nullptr;
      check(cudaMalloc(&p, o.bytes), "cudaMalloc (memory the peers map)");
      o.p = static_cast<std::byte*>(p);
    }
    // Zeroed before it is handed out: cudaMemset goes on the legacy default stream, which
    // orders nothing with the transport's non-blocking stream, so the host waits for it here.
    cudaError_t e = cudaMemsetAsync(o.p, 0, o.bytes, cudaStreamPerThread);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cudaStreamPerThread);
    if (e != cudaSuccess) {
      release(o);
      check(e, "cudaMemsetAsync");
    }
    return o;
  }
  void release(owned& o) noexcept {
    if (!o.p) return;
    cudaSetDevice(dev_);
    if (vmm_) {
      const detail::driver& d = detail::driver::get();
      cudaDeviceSynchronize();  // (no kernel of this rank may still touch it)
      d.memUnmap(CUdeviceptr(o.p), o.bytes);
      d.memAddressFree(CUdeviceptr(o.p), o.bytes);
      d.memRelease(o.h);
    } else {
      cudaFree(o.p);
    }
    o = owned{};
  }

  /// The allocation holding [p, p + bytes) (see the top for which can be exported).
  device::ipc::alloc_desc describe(const std::byte* p, std::size_t bytes, std::uint64_t& offset) {
    device::ipc::alloc_desc a;
    offset = 0;
    const detail::driver& d = detail::driver::get();
    if (p == nullptr || d.pointerGetAttributes == nullptr) return a;
    unsigned long long buffer_id = 0, block_id = 0, handle_types = 0;
    CUdeviceptr range_start = 0, map_base = 0;
    std::size_t range_size = 0, map_size = 0;
    int legacy = 0;
    CUmemoryPool pool = nullptr;
    CUpointer_attribute at[] = {CU_POINTER_ATTRIBUTE_BUFFER_ID,         CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                CU_POINTER_ATTRIBUTE_RANGE_SIZE,        CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, CU_POINTER_ATTRIBUTE_MAPPING_SIZE,
                                CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID,
                                CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE};
    void* data[] = {&buffer_id, &range_start, &range_size, &legacy, &map_base, &map_size, &handle_types, &block_id, &pool};
    if (d.pointerGetAttributes(unsigned(std::size(at)), at, data, CUdeviceptr(p)) != CUDA_SUCCESS) return a;
    const auto at_p = CUdeviceptr(p);
    if (pool != nullptr) return a;  // a pool's memory: staged (its export is per pool, not per allocation)
    if ((handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0 && map_base != 0 && at_p >= map_base &&
        at_p + bytes <= map_base + map_size) {
      // (the driver's block ids and buffer ids are two counters: the top bit keeps them apart)
      a.id = (block_id != 0 ? block_id : buffer_id) | kVmmIdBit;
      a.size = map_size;
      a.kind = device::ipc::handle_kind::fd;
      const std::uint64_t base = map_base;
      std::memcpy(a.handle.data(), &base, sizeof base);  // (export_fd retains the allocation mapped there)
      offset = at_p - map_base;
      return a;
    }
    if (legacy != 0 && range_start != 0 && at_p + bytes <= range_start + range_size) {
      a.id = buffer_id & ~kVmmIdBit;
      a.size = range_size;
      a.kind = device::ipc::handle_kind::opaque;
      std::lock_guard g(cache_->mu);
      auto& handles = cache_->handles;
      auto it = handles.find(buffer_id);
      if (it == handles.end()) {
        cudaIpcMemHandle_t h{};
        if (cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(range_start)) != cudaSuccess) {
          (void)cudaGetLastError();
          return device::ipc::alloc_desc{};
        }
        if (handles.size() > 4096) handles.clear();
        it = handles.emplace(buffer_id, h).first;
      }
      static_assert(sizeof(cudaIpcMemHandle_t) <= 64);
      std::memcpy(a.handle.data(), &it->second, sizeof(cudaIpcMemHandle_t));
      offset = at_p - range_start;
      return a;
    }
    return a;
  }

  int export_fd(const device::ipc::alloc_desc& a) {
    const detail::driver& d = detail::driver::get();
    std::uint64_t base = 0;
    std::memcpy(&base, a.handle.data(), sizeof base);
    CUmemGenericAllocationHandle h = 0;
    d.check(d.memRetainAllocationHandle(&h, reinterpret_cast<void*>(base)), "cuMemRetainAllocationHandle");
    int fd = -1;
    const CUresult r = d.memExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    d.memRelease(h);
    d.check(r, "cuMemExportToShareableHandle");
    return fd;
  }

  std::byte* import(const device::ipc::alloc_desc& a, int fd) {
    check(cudaSetDevice(dev_), "cudaSetDevice");
    if (a.kind == device::ipc::handle_kind::opaque) {
      cudaIpcMemHandle_t h{};
      std::memcpy(&h, a.handle.data(), sizeof h);
      void* p = nullptr;
      check(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
      return static_cast<std::byte*>(p);
    }
    const detail::driver& d = detail::driver::get();
    if (!d.missing.empty()) throw error(errc::transport_error, "collx::cuda: the driver lacks " + d.missing + " (VMM)");
    CUmemGenericAllocationHandle h = 0;
    d.check(d.memImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd)),
                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            "cuMemImportFromShareableHandle");
    CUdeviceptr va = 0;
    CUresult r = d.memAddressReserve(&va, a.size, 0, 0, 0);
    if (r == CUDA_SUCCESS) {
      r = d.memMap(va, a.size, 0, h, 0);
      if (r == CUDA_SUCCESS) {
        const CUmemAccessDesc acc = access();
        r = d.memSetAccess(va, a.size, &acc, 1);
        if (r != CUDA_SUCCESS) d.memUnmap(va, a.size);
      }
      if (r != CUDA_SUCCESS) d.memAddressFree(va, a.size);
    }
    d.memRelease(h);  // the mapping keeps the memory
    d.check(r, "mapping a peer's memory (cuMemAddressReserve / cuMemMap / cuMemSetAccess)");
    return reinterpret_cast<std::byte*>(va);
  }

  /// Waits until this process's queued kernels are done: one may still read what is about to be
  /// unmapped (a stream-ordered call's kernel waits on the stream while later calls map).
  void quiesce() noexcept {
    cudaSetDevice(dev_);
    cudaDeviceSynchronize();
  }

  void unmap(std::byte* base, const device::ipc::alloc_desc& a) noexcept {
    cudaSetDevice(dev_);
    if (a.kind == device::ipc::handle_kind::opaque) {
      cudaIpcCloseMemHandle(base);
      return;
    }
    const detail::driver& d = detail::driver::get();
    d.memUnmap(CUdeviceptr(base), a.size);
    d.memAddressFree(CUdeviceptr(base), a.size);
  }

  void write(std::byte* dst, const void* src, std::size_t bytes) {
    check(cudaSetDevice(dev_), "cudaSetDevice");
    check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    // (From pageable memory the copy returns once the bytes are staged; the kernels that read
    // them run on streams that do not wait for the default stream.)
    check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
  }
  void* register_host(void* p, std::size_t bytes) {
    check(cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable), "cudaHostRegister (the job block)");
    void* d = nullptr;
    check(cudaHostGetDevicePointer(&d, p, 0), "cudaHostGetDevicePointer");
    return d;
  }
  void unregister_host(void* p) noexcept { cudaHostUnregister(p); }

 private:
  CUmemAllocationProp props() const {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev_;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return prop;
  }
  CUmemAccessDesc access() const {
    CUmemAccessDesc a{};
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = dev_;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return a;
  }
  static constexpr unsigned long long kVmmIdBit = 1ull << 63;
  int dev_;
  bool vmm_ = false;
  std::array<std::uint8_t, 16> uuid_{};
  struct cache {
    std::mutex mu;
    std::map<unsigned long long, cudaIpcMemHandle_t> handles;  // cudaIpcGetMemHandle's, by buffer id
  };
  std::unique_ptr<cache> cache_ = std::make_unique<cache>();
};

namespace detail {
inline std::mutex& exportable_mu() {
  static std::mutex m;
  return m;
}
inline std::map<void*, std::pair<ipc_backend::owned, int>>& exportables() {
  static std::map<void*, std::pair<ipc_backend::owned, int>> m;
  return m;
}
}  // namespace detail

/// Device memory the peers of a process-rank map in place, never staged (VMM, exportable as a
/// POSIX descriptor): what a program allocates its collective buffers from to avoid the staging
/// copy (cudaMalloc memory is mapped in place too, through its cudaIpc handle). Zeroed; freed
/// with free_exportable once no call uses it.
inline void* alloc_exportable(std::size_t bytes, int device) {
  ipc_backend b(device, ipc_mode::vmm);
  ipc_backend::owned o = b.allocate(bytes);
  std::lock_guard g(detail::exportable_mu());
  detail::exportables()[o.p] = {o, device};
  return o.p;
}
inline void free_exportable(void* p) noexcept {
  ipc_backend::owned o;
  int device = 0;
  {
    std::lock_guard g(detail::exportable_mu());
    auto it = detail::exportables().find(p);
    if (it == detail::exportables().end()) return;
    o = it->second.first;
    device = it->second.second;
    detail::exportables().erase(it);
  }
  const detail::driver& d = detail::driver::get();
  int was = 0;
  cudaGetDevice(&was);
  cudaSetDevice(device);
  cudaDeviceSynchronize();
  d.memUnmap(CUdeviceptr(o.p), o.bytes);
  d.memAddressFree(CUdeviceptr(o.p), o.bytes);
  d.memRelease(o.h);
  cudaSetDevice(was);
}

}  // namespace collx::cuda
