// Package image builds and keeps the root file systems that leases run on.
//
// A lease is a small machine with an image of its own, never a view of the
// host's files: its / is an overlay of a read-only image and the lease's
// own upper layer (package machine lays the layers out, package leaseinit
// mounts them). The default image is a Debian system of the release the
// host runs, built from Debian's packages by mmdebstrap:
//
//	cache := image.Cache{Dir: image.DefaultCacheDir(), Progress: os.Stderr}
//	r, err := image.DefaultRecipe()      // suite of the host, fixed package list
//	dir, err := cache.Ensure(ctx, r)     // built once, then found
//
// Building is reproducible and done once per recipe:
//
//   - The recipe (suite, variant, package list, mmdebstrap options and
//     SOURCE_DATE_EPOCH) is hashed, and the image is kept at
//     <cache>/<suite>-<hash>: a changed recipe builds a new image beside
//     the old one, an unchanged one is never built again.
//   - The mirror is not part of the recipe and is never written into this
//     package: the host's own apt sources (/etc/apt/sources.list and
//     sources.list.d) are read at build time and handed to mmdebstrap on
//     its standard input.
//   - mmdebstrap builds into a temporary directory of the cache, which is
//     renamed into place only once complete, so that a crash leaves no
//     half image under the final name; a lock file serialises builders
//     (several servers, parallel test packages), and whoever waited finds
//     the image built.
//   - The first build shows mmdebstrap's progress, each line prefixed
//     "image: ", on Cache.Progress.
//
// Every failure is an *Error naming its step (StepSources, StepBuild, …).
package image
