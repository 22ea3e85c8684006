"""A FUSE file system over a folder that fails like a dying disk on demand:
failing_fs.py BACKING MOUNTPOINT CONTROL mounts BACKING at MOUNTPOINT, and
before each write and fsync reads CONTROL (a file outside the mount):
"ok" passes everything through, "eio-write" fails writes with EIO,
"eio-fsync" fails fsync (files and folders) with EIO, "eio-read" fails
reads. Runs in the foreground until unmounted (umount MOUNTPOINT).
Needs python3-fusepy and root (or /dev/fuse and fusermount)."""
import errno
import os
import sys

import fusepy


class FailingFs(fusepy.Operations):
    def __init__(self, root, control):
        self.root = os.path.realpath(root)
        self.control = control

    def _path(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def _failing(self, what):
        try:
            with open(self.control) as f:
                mode = f.read().strip()
        except OSError:
            mode = "ok"
        if mode == "eio-" + what:
            raise fusepy.FuseOSError(errno.EIO)

    def access(self, path, mode):
        if not os.access(self._path(path), mode):
            raise fusepy.FuseOSError(errno.EACCES)

    def getattr(self, path, fh=None):
        st = os.lstat(self._path(path))
        return {k: getattr(st, k) for k in (
            "st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink",
            "st_size", "st_uid")}

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self._path(path))

    def statfs(self, path):
        st = os.statvfs(self._path(path))
        return {k: getattr(st, k) for k in (
            "f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree",
            "f_files", "f_flag", "f_frsize", "f_namemax")}

    def chmod(self, path, mode):
        os.chmod(self._path(path), mode)

    def chown(self, path, uid, gid):
        os.chown(self._path(path), uid, gid)

    def utimens(self, path, times=None):
        os.utime(self._path(path), times)

    def mkdir(self, path, mode):
        os.mkdir(self._path(path), mode)

    def rmdir(self, path):
        os.rmdir(self._path(path))

    def unlink(self, path):
        os.unlink(self._path(path))

    def rename(self, old, new):
        os.rename(self._path(old), self._path(new))

    def truncate(self, path, length, fh=None):
        with open(self._path(path), "r+") as f:
            f.truncate(length)

    def open(self, path, flags):
        return os.open(self._path(path), flags)

    def create(self, path, mode, fi=None):
        return os.open(self._path(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

    def read(self, path, size, offset, fh):
        self._failing("read")
        return os.pread(fh, size, offset)

    def write(self, path, data, offset, fh):
        self._failing("write")
        return os.pwrite(fh, data, offset)

    def flush(self, path, fh):
        return 0

    def fsync(self, path, datasync, fh):
        self._failing("fsync")
        os.fsync(fh)
        return 0

    def fsyncdir(self, path, datasync, fh):
        self._failing("fsync")
        return 0

    def release(self, path, fh):
        os.close(fh)
        return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: failing_fs.py BACKING MOUNTPOINT CONTROL")
    fusepy.FUSE(FailingFs(sys.argv[1], sys.argv[3]), sys.argv[2], foreground=True,
                nothreads=False, allow_other=True)
