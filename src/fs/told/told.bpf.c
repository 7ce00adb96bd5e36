// SPDX-License-Identifier: GPL-2.0
//
// Opens of the mount's files, told to the daemon (src/fs/told/events.rs): at the exit of each
// open system call, the new descriptor's inode; where it is a regular file of the mount's
// device, its inode number (the FUSE node id, which coorfs reports as st_ino), the opening
// thread and its effective uid go into a ring buffer that the told-open thread drains. The
// daemon sets target_dev (the mount's device, as the kernel numbers it) before loading.
//
// Built by build.rs with clang (-target bpf); the kernel structures are read with CO-RE, so the
// fields named below are found at their offsets in the running kernel's BTF, whatever they are.

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

#define CORE __attribute__((preserve_access_index))

struct super_block { __u32 s_dev; } CORE;
struct inode { __u16 i_mode; struct super_block *i_sb; unsigned long i_ino; } CORE;
struct file { struct inode *f_inode; } CORE;
struct fdtable { unsigned int max_fds; struct file **fd; } CORE;
struct files_struct { struct fdtable *fdt; } CORE;
typedef struct { __u32 val; } kuid_t;
struct cred { kuid_t euid; } CORE;
struct task_struct { struct files_struct *files; const struct cred *cred; } CORE;

// A syscalls:sys_exit_* tracepoint's record: the common header, the syscall's number, its
// return value (/sys/kernel/tracing/events/syscalls/sys_exit_openat/format).
struct sys_exit { __u64 common; long nr; long ret; };

// The mount's device (MKDEV(major, minor)); set at load.
volatile const __u32 target_dev = 0;

// One told open, as src/fs/told/events.rs reads it.
struct told { __u64 node; __u32 tid; __u32 uid; };

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 1 << 20);
} opens SEC(".maps");

// Opens lost to a full ring.
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u64);
} lost SEC(".maps");

static __always_inline int told(struct sys_exit *ctx) {
    long fd = ctx->ret;
    if (fd < 0)
        return 0;
    struct task_struct *task = (struct task_struct *)bpf_get_current_task();
    struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
    if (!fdt || (unsigned long)fd >= BPF_CORE_READ(fdt, max_fds))
        return 0;
    struct file **fds = BPF_CORE_READ(fdt, fd);
    struct file *file = 0;
    if (bpf_probe_read_kernel(&file, sizeof(file), &fds[fd]) || !file)
        return 0;
    struct inode *inode = BPF_CORE_READ(file, f_inode);
    if (!inode || BPF_CORE_READ(inode, i_sb, s_dev) != target_dev)
        return 0;
    if ((BPF_CORE_READ(inode, i_mode) & 0170000) != 0100000)
        return 0;
    struct told t = {
        .node = BPF_CORE_READ(inode, i_ino),
        .tid = (__u32)bpf_get_current_pid_tgid(),
        .uid = BPF_CORE_READ(task, cred, euid.val),
    };
    if (bpf_ringbuf_output(&opens, &t, sizeof(t), 0)) {
        __u32 key = 0;
        __u64 *n = bpf_map_lookup_elem(&lost, &key);
        if (n)
            __sync_fetch_and_add(n, 1);
    }
    return 0;
}

SEC("tracepoint/syscalls/sys_exit_openat")
int exit_openat(struct sys_exit *ctx) { return told(ctx); }

SEC("tracepoint/syscalls/sys_exit_openat2")
int exit_openat2(struct sys_exit *ctx) { return told(ctx); }

SEC("tracepoint/syscalls/sys_exit_open")
int exit_open(struct sys_exit *ctx) { return told(ctx); }

char LICENSE[] SEC("license") = "GPL";
