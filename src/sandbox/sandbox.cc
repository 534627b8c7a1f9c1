#include "sandbox/sandbox.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#ifdef __linux__
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#endif

namespace minions::sandbox {
namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

void AddIfExists(std::vector<std::string>* list, const std::string& path) {
  if (Exists(path)) list->push_back(path);
}

}  // namespace

Policy SystemPolicy() {
  Policy policy;
#ifdef __APPLE__
  for (const char* path : {"/usr/lib", "/usr/share", "/System", "/Library/Apple", "/private/var/db/dyld",
                           "/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"}) {
    AddIfExists(&policy.read_only, path);
  }
#else
  // Libraries and the loader (merged /usr or not), CPU and memory facts the runtime reads.
  for (const char* path : {"/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/etc/ld.so.cache",
                           "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/proc/cpuinfo",
                           "/proc/meminfo", "/proc/stat", "/sys/devices/system/cpu", "/sys/devices/system/node",
                           "/sys/fs/cgroup", "/dev/zero", "/dev/urandom", "/dev/random"}) {
    AddIfExists(&policy.read_only, path);
  }
  // The process's own /proc entries (the folder of this pid, which execve keeps).
  AddIfExists(&policy.read_only, absl::StrCat("/proc/", ::getpid()));
  AddIfExists(&policy.read_write, "/dev/null");
  // GPUs: NVIDIA's device files and driver information, DRM render nodes.
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("nvidia", 0) == 0) policy.devices.push_back(entry.path().string());
  }
  AddIfExists(&policy.devices, "/dev/dri");
  AddIfExists(&policy.read_only, "/proc/driver/nvidia");
  AddIfExists(&policy.read_only, "/sys/bus/pci");
  AddIfExists(&policy.read_only, "/sys/devices");
  AddIfExists(&policy.read_only, "/sys/module/nvidia");
#endif
  return policy;
}

#ifdef __linux__
namespace {

// Landlock, by ABI version (constants are defined here: the build machine's headers may be older
// than the kernel the executor runs on).
constexpr uint64_t kFsExecute = 1ULL << 0, kFsWriteFile = 1ULL << 1, kFsReadFile = 1ULL << 2,
                   kFsReadDir = 1ULL << 3, kFsRemoveDir = 1ULL << 4, kFsRemoveFile = 1ULL << 5,
                   kFsMakeChar = 1ULL << 6, kFsMakeDir = 1ULL << 7, kFsMakeReg = 1ULL << 8,
                   kFsMakeSock = 1ULL << 9, kFsMakeFifo = 1ULL << 10, kFsMakeBlock = 1ULL << 11,
                   kFsMakeSym = 1ULL << 12, kFsRefer = 1ULL << 13, kFsTruncate = 1ULL << 14,
                   kFsIoctlDev = 1ULL << 15;
constexpr uint64_t kNetBindTcp = 1ULL << 0, kNetConnectTcp = 1ULL << 1;
constexpr uint64_t kScopeAbstractUnixSocket = 1ULL << 0, kScopeSignal = 1ULL << 1;
constexpr uint32_t kCreateRulesetVersion = 1U << 0;
constexpr int kRulePathBeneath = 1;
constexpr int kRuleNetPort = 2;
struct NetPortAttr {
  uint64_t allowed_access;
  uint64_t port;
} __attribute__((packed));

struct RulesetAttr {
  uint64_t handled_access_fs;
  uint64_t handled_access_net;
  uint64_t scoped;
};
struct PathBeneathAttr {
  uint64_t allowed_access;
  int32_t parent_fd;
} __attribute__((packed));

#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#define SYS_landlock_add_rule 445
#define SYS_landlock_restrict_self 446
#endif

// Rights a rule on a file (not a folder) may carry.
constexpr uint64_t kFileRights = kFsExecute | kFsWriteFile | kFsReadFile | kFsTruncate | kFsIoctlDev;

uint64_t HandledFs(int abi) {
  uint64_t fs = kFsExecute | kFsWriteFile | kFsReadFile | kFsReadDir | kFsRemoveDir | kFsRemoveFile | kFsMakeChar |
                kFsMakeDir | kFsMakeReg | kFsMakeSock | kFsMakeFifo | kFsMakeBlock | kFsMakeSym;
  if (abi >= 2) fs |= kFsRefer;
  if (abi >= 3) fs |= kFsTruncate;
  if (abi >= 5) fs |= kFsIoctlDev;
  return fs;
}

absl::Status AddRule(int ruleset, const std::string& path, uint64_t access, uint64_t handled) {
  int fd = ::open(path.c_str(), O_PATH | O_CLOEXEC);
  if (fd < 0) return absl::OkStatus();  // gone meanwhile: nothing to allow
  struct stat st;
  if (::fstat(fd, &st) == 0 && !S_ISDIR(st.st_mode)) access &= kFileRights;
  PathBeneathAttr rule{access & handled, fd};
  long r = ::syscall(SYS_landlock_add_rule, ruleset, kRulePathBeneath, &rule, 0);
  int err = errno;
  ::close(fd);
  if (r != 0) return absl::InternalError(absl::StrCat("landlock_add_rule(", path, "): ", std::strerror(err)));
  return absl::OkStatus();
}

// Returns the ABI applied (0: Landlock unavailable).
absl::StatusOr<int> ApplyLandlock(const Policy& policy) {
  long abi = ::syscall(SYS_landlock_create_ruleset, nullptr, 0, kCreateRulesetVersion);
  if (abi < 1) return 0;
  RulesetAttr attr{HandledFs(static_cast<int>(abi)), 0, 0};
  size_t size = sizeof(uint64_t);
  if (abi >= 4) {
    attr.handled_access_net = kNetBindTcp | kNetConnectTcp;  // no rule allows any port: no TCP at all
    size = 2 * sizeof(uint64_t);
  }
  if (abi >= 6) {
    attr.scoped = kScopeAbstractUnixSocket | kScopeSignal;  // no signals or abstract sockets outside
    size = sizeof(RulesetAttr);
  }
  int ruleset = static_cast<int>(::syscall(SYS_landlock_create_ruleset, &attr, size, 0));
  if (ruleset < 0) return absl::InternalError(absl::StrCat("landlock_create_ruleset: ", std::strerror(errno)));
  const uint64_t handled = attr.handled_access_fs;
  const uint64_t read = kFsExecute | kFsReadFile | kFsReadDir;
  absl::Status added;
  for (const std::string& path : policy.read_only) {
    if (added.ok()) added = AddRule(ruleset, path, read, handled);
  }
  for (const std::string& path : policy.read_write) {
    if (added.ok()) added = AddRule(ruleset, path, handled & ~kFsIoctlDev, handled);
  }
  for (const std::string& path : policy.devices) {
    if (added.ok()) added = AddRule(ruleset, path, read | kFsWriteFile | kFsIoctlDev, handled);
  }
  if (abi >= 4) {
    for (int port : policy.connect_tcp_ports) {
      NetPortAttr rule{kNetConnectTcp, static_cast<uint64_t>(port)};
      if (added.ok() && ::syscall(SYS_landlock_add_rule, ruleset, kRuleNetPort, &rule, 0) != 0) {
        added = absl::InternalError(absl::StrCat("landlock_add_rule(tcp port ", port, "): ", std::strerror(errno)));
      }
    }
    for (int port : policy.bind_tcp_ports) {
      NetPortAttr rule{kNetBindTcp, static_cast<uint64_t>(port)};
      if (added.ok() && ::syscall(SYS_landlock_add_rule, ruleset, kRuleNetPort, &rule, 0) != 0) {
        added = absl::InternalError(absl::StrCat("landlock_add_rule(tcp bind ", port, "): ", std::strerror(errno)));
      }
    }
  }
  if (added.ok() && ::syscall(SYS_landlock_restrict_self, ruleset, 0) != 0) {
    added = absl::InternalError(absl::StrCat("landlock_restrict_self: ", std::strerror(errno)));
  }
  ::close(ruleset);
  if (!added.ok()) return added;
  return static_cast<int>(abi);
}

#if defined(__x86_64__)
constexpr uint32_t kAuditArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr uint32_t kAuditArch = AUDIT_ARCH_AARCH64;
#else
#define MINIONS_NO_SECCOMP 1
#endif

#ifndef MINIONS_NO_SECCOMP
// seccomp: everything is allowed except the calls below, which fail with EPERM (ENOSYS for
// io_uring and clone3, so that libraries fall back to what the filter can see).
absl::Status ApplySeccomp(bool allow_ip_sockets) {
  struct Denied {
    long nr;
    int error;
  };
  std::vector<Denied> denied = {
      {SYS_socket, EPERM},          {SYS_ptrace, EPERM},          {SYS_process_vm_readv, EPERM},
      {SYS_process_vm_writev, EPERM}, {SYS_mount, EPERM},          {SYS_umount2, EPERM},
      {SYS_pivot_root, EPERM},      {SYS_chroot, EPERM},          {SYS_unshare, EPERM},
      {SYS_setns, EPERM},           {SYS_bpf, EPERM},             {SYS_keyctl, EPERM},
      {SYS_add_key, EPERM},         {SYS_request_key, EPERM},     {SYS_init_module, EPERM},
      {SYS_finit_module, EPERM},    {SYS_delete_module, EPERM},   {SYS_kexec_load, EPERM},
      {SYS_perf_event_open, EPERM}, {SYS_userfaultfd, EPERM},     {SYS_swapon, EPERM},
      {SYS_swapoff, EPERM},         {SYS_reboot, EPERM},          {SYS_io_uring_setup, ENOSYS},
      {SYS_io_uring_enter, ENOSYS}, {SYS_io_uring_register, ENOSYS}, {SYS_clone3, ENOSYS},
  };
  std::vector<sock_filter> program;
  program.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)));
  program.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kAuditArch, 1, 0));
  program.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS));
  program.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)));
#if defined(__x86_64__)
  // x32 calls carry the same audit arch with this bit set: none is allowed.
  program.push_back(BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000, 0, 1));
  program.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM));
#endif
  if (allow_ip_sockets) {
    // A gang's leader: IPv4 and IPv6 sockets only (Landlock limits where TCP may connect).
    program.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_socket, 0, 4));
    program.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[0])));
    program.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_INET, 1, 0));
    program.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_INET6, 0, 1));
    program.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
    // Anything else falls through to the list below (socket: EPERM); the accumulator is reloaded.
    program.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)));
  }
  for (const Denied& d : denied) {
    program.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(d.nr), 0, 1));
    program.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (static_cast<uint32_t>(d.error) & SECCOMP_RET_DATA)));
  }
  // clone with namespace flags (a user namespace would give the runner capabilities of its own).
  constexpr uint32_t kNamespaceFlags = 0x00020000 /*NEWNS*/ | 0x02000000 /*NEWCGROUP*/ | 0x04000000 /*NEWUTS*/ |
                                       0x08000000 /*NEWIPC*/ | 0x10000000 /*NEWUSER*/ | 0x20000000 /*NEWPID*/ |
                                       0x40000000 /*NEWNET*/;
  program.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone, 0, 3));
  program.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[0])));
  program.push_back(BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, kNamespaceFlags, 0, 1));
  program.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM));
  program.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  sock_fprog fprog{static_cast<unsigned short>(program.size()), program.data()};
  if (::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fprog, 0, 0) != 0) {
    return absl::InternalError(absl::StrCat("seccomp: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}
#endif

}  // namespace

int LandlockAbi() {
  long abi = ::syscall(SYS_landlock_create_ruleset, nullptr, 0, kCreateRulesetVersion);
  return abi < 1 ? 0 : static_cast<int>(abi);
}

std::string Confinement(bool confine) {
  if (!confine) return "none";
#ifdef MINIONS_NO_SECCOMP
  return "partial";  // Landlock at most
#else
  return LandlockAbi() > 0 ? "full" : "partial";
#endif
}

absl::StatusOr<std::string> ApplyToSelf(const Policy& policy, bool require_landlock) {
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
    return absl::InternalError(absl::StrCat("no_new_privs: ", std::strerror(errno)));
  }
  auto abi = ApplyLandlock(policy);
  if (!abi.ok()) return abi.status();
  if (*abi == 0 && require_landlock) {
    return absl::FailedPreconditionError("this kernel has no Landlock (Linux 5.13 or later, with landlock in lsm=)");
  }
  std::string applied =
      *abi == 0 ? "no landlock (the kernel has none)"
                : absl::StrCat("landlock ABI ", *abi, " (files", *abi >= 4 ? ", tcp" : "", *abi >= 6 ? ", scopes" : "", ")");
  if (!policy.connect_tcp_ports.empty()) {
    if (*abi < 4 && require_landlock) {
      return absl::FailedPreconditionError("this kernel's Landlock cannot limit TCP to a gang's ports (ABI 4 or later)");
    }
    absl::StrAppend(&applied, ", tcp to ", policy.connect_tcp_ports.size(), " gang port(s)",
                    *abi < 4 ? " (not limited: Landlock before ABI 4)" : "");
  }
#ifndef MINIONS_NO_SECCOMP
  if (!policy.bind_tcp_ports.empty()) {
    if (*abi < 4 && require_landlock) {
      return absl::FailedPreconditionError("this kernel's Landlock cannot limit which TCP port is listened on (ABI 4 or later)");
    }
    absl::StrAppend(&applied, ", listens on ", policy.bind_tcp_ports.size(), " tcp port(s)",
                    *abi < 4 ? " (not limited: Landlock before ABI 4)" : "");
  }
  if (absl::Status s = ApplySeccomp(!policy.connect_tcp_ports.empty() || !policy.bind_tcp_ports.empty()); !s.ok()) {
    return s;
  }
  absl::StrAppend(&applied, ", seccomp");
#endif
  return applied;
}

#else  // !__linux__

int LandlockAbi() { return 0; }

std::string Confinement(bool confine) {
#ifdef __APPLE__
  return confine ? "full" : "none";  // sandbox-exec's profile
#else
  return confine ? "partial" : "none";  // no sandbox of this platform's own: the environment only
#endif
}

absl::StatusOr<std::string> ApplyToSelf(const Policy&, bool require_landlock) {
  if (require_landlock) return absl::FailedPreconditionError("Landlock is Linux's");
  return std::string("no in-process sandbox on this platform");
}

#endif

std::string MacProfile(const Policy& policy, const std::string& program) {
  auto quoted = [](const std::string& path) {
    std::string out = "\"";
    for (char c : path) {
      if (c == '"' || c == '\\') out.push_back('\\');
      out.push_back(c);
    }
    return out + "\"";
  };
  std::string profile = "(version 1)\n(deny default)\n";
  absl::StrAppend(&profile, "(allow process-exec (literal ", quoted(program), "))\n");
  profile += "(allow process-fork)\n(allow signal (target self))\n(allow sysctl-read)\n";
  profile += "(allow file-read-metadata)\n";  // stat of any path (the loader walks them); no contents
  profile += "(allow file-read*";
  for (const std::string& path : policy.read_only) absl::StrAppend(&profile, "\n  (subpath ", quoted(path), ")");
  absl::StrAppend(&profile, "\n  (literal ", quoted(program), "))\n");
  if (!policy.read_write.empty()) {
    profile += "(allow file-read* file-write*";
    for (const std::string& path : policy.read_write) absl::StrAppend(&profile, "\n  (subpath ", quoted(path), ")");
    profile += ")\n";
  }
  profile += "(allow file-write-data (literal \"/dev/null\"))\n";
  // Metal: the GPU's user clients and the shader compiler service; nothing else of the system.
  profile +=
      "(allow iokit-open (iokit-user-client-class \"AGXDeviceUserClient\") "
      "(iokit-user-client-class \"IOSurfaceRootUserClient\") (iokit-user-client-class \"AGXSharedUserClient\"))\n"
      "(allow mach-lookup (global-name \"com.apple.MTLCompilerService\") "
      "(global-name \"com.apple.CoreServices.coreservicesd\") (global-name \"com.apple.system.opendirectoryd.libinfo\"))\n"
      "(allow ipc-posix-shm-read-data ipc-posix-shm-write-data)\n";
  profile += "(deny network*)\n";
  for (int port : policy.connect_tcp_ports) {
    profile += absl::StrCat("(allow network-outbound (remote tcp \"*:", port, "\"))\n");
  }
  for (int port : policy.bind_tcp_ports) {
    profile += absl::StrCat("(allow network-bind network-inbound (local tcp \"localhost:", port, "\"))\n");
  }
  return profile;
}

}  // namespace minions::sandbox
