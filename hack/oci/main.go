// Command oci: what a release and the kind tier do with OCI images, with go-containerregistry and
// no Docker daemon, no registry on the Internet.
//
//	oci layout   -out DIR -ref NAME [-annotation k=v]... DOCKER_SAVE.tar...
//	    one image per tarball (`docker save` of one image per platform) into an OCI image layout
//	    at DIR: an OCI index of every platform's manifest, the annotations on the index and on
//	    each manifest, listed in DIR/index.json under org.opencontainers.image.ref.name=NAME.
//	    Prints the index's digest, which is what a release pins.
//	oci push     -layout DIR|ARCHIVE.tar -ref REGISTRY/REPO:TAG [-insecure]
//	    pushes the layout's index (every platform) to REF, from the layout's directory or a tar
//	    of it (what make release writes); prints its digest.
//	oci digest   REF
//	    the digest REF's tag points at in its registry (make pin-base).
//	oci registry -addr HOST:PORT [-dir DIR]
//	    serves go-containerregistry's registry (the OCI distribution API) on ADDR, blobs on disk
//	    under DIR or in memory: the kind tier's registry, which the nodes pull from.
package main

import (
	"archive/tar"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

type pairs map[string]string

func (p pairs) String() string { return fmt.Sprint(map[string]string(p)) }

func (p pairs) Set(value string) error {
	key, val, ok := strings.Cut(value, "=")
	if !ok || key == "" {
		return fmt.Errorf("%q is not key=value", value)
	}
	p[key] = val
	return nil
}

func main() {
	log.SetFlags(0)
	log.SetPrefix("oci: ")
	if len(os.Args) < 2 {
		log.Fatal("usage: oci layout|push|digest|registry ...")
	}
	var err error
	switch os.Args[1] {
	case "layout":
		err = layoutCommand(os.Args[2:])
	case "push":
		err = pushCommand(os.Args[2:])
	case "registry":
		err = registryCommand(os.Args[2:])
	case "digest":
		err = digestCommand(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: layout, push, digest or registry", os.Args[1])
	}
	if err != nil {
		log.Fatal(err)
	}
}

// asOCI is the image rebuilt with OCI media types (docker save writes Docker's), the same layers
// and the same config: registries and tools that read only OCI then read it too.
func asOCI(img v1.Image) (v1.Image, error) {
	config, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	out := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	for _, layer := range layers {
		if out, err = mutate.Append(out, mutate.Addendum{Layer: layer, MediaType: types.OCILayer}); err != nil {
			return nil, err
		}
	}
	return mutate.ConfigFile(out, config)
}

func layoutCommand(args []string) error {
	flags := flag.NewFlagSet("layout", flag.ExitOnError)
	out := flags.String("out", "", "the layout's directory (must not exist)")
	ref := flags.String("ref", "", "org.opencontainers.image.ref.name of the index in index.json")
	annotations := pairs{}
	flags.Var(annotations, "annotation", "key=value on the index and each manifest (repeatable)")
	_ = flags.Parse(args)
	if *out == "" || *ref == "" || flags.NArg() == 0 {
		return fmt.Errorf("layout: -out, -ref and at least one docker save tarball are required")
	}
	if _, err := os.Stat(*out); err == nil {
		return fmt.Errorf("layout: %s exists", *out)
	}
	index := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	seen := map[string]string{}
	for _, path := range flags.Args() {
		loaded, err := tarball.ImageFromPath(path, nil)
		if err != nil {
			return fmt.Errorf("layout: %s: %w", path, err)
		}
		img, err := asOCI(loaded)
		if err != nil {
			return fmt.Errorf("layout: %s: %w", path, err)
		}
		img = mutate.Annotations(img, annotations).(v1.Image)
		config, err := img.ConfigFile()
		if err != nil {
			return err
		}
		platform := v1.Platform{OS: config.OS, Architecture: config.Architecture, Variant: config.Variant}
		if other, twice := seen[platform.String()]; twice {
			return fmt.Errorf("layout: %s and %s are both %s", other, path, platform.String())
		}
		seen[platform.String()] = path
		index = mutate.AppendManifests(index, mutate.IndexAddendum{
			Add: img, Descriptor: v1.Descriptor{Platform: &platform, Annotations: annotations}})
	}
	index = mutate.Annotations(index, annotations).(v1.ImageIndex)
	written, err := layout.Write(*out, empty.Index)
	if err != nil {
		return err
	}
	if err := written.AppendIndex(index, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": *ref})); err != nil {
		return err
	}
	digest, err := index.Digest()
	if err != nil {
		return err
	}
	fmt.Println(digest.String())
	return nil
}

// untar extracts a tar of a layout (regular files and directories only) into a new directory.
func untar(archive string) (string, error) {
	dir, err := os.MkdirTemp("", "oci-layout-")
	if err != nil {
		return "", err
	}
	file, err := os.Open(archive)
	if err != nil {
		return dir, err
	}
	defer file.Close()
	reader := tar.NewReader(file)
	for {
		header, err := reader.Next()
		if err == io.EOF {
			return dir, nil
		}
		if err != nil {
			return dir, err
		}
		target := filepath.Join(dir, filepath.Clean("/"+header.Name))
		switch header.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return dir, err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return dir, err
			}
			out, err := os.Create(target)
			if err != nil {
				return dir, err
			}
			if _, err := io.Copy(out, reader); err != nil {
				out.Close()
				return dir, err
			}
			if err := out.Close(); err != nil {
				return dir, err
			}
		default:
			return dir, fmt.Errorf("%s: %s is neither a file nor a directory", archive, header.Name)
		}
	}
}

// theIndex is the one index a layout written by `oci layout` lists.
func theIndex(dir string) (v1.ImageIndex, error) {
	path, err := layout.FromPath(dir)
	if err != nil {
		return nil, err
	}
	top, err := path.ImageIndex()
	if err != nil {
		return nil, err
	}
	manifest, err := top.IndexManifest()
	if err != nil {
		return nil, err
	}
	if len(manifest.Manifests) != 1 || !manifest.Manifests[0].MediaType.IsIndex() {
		return nil, fmt.Errorf("%s/index.json lists %d descriptors; want one image index", dir, len(manifest.Manifests))
	}
	return top.ImageIndex(manifest.Manifests[0].Digest)
}

func pushCommand(args []string) error {
	flags := flag.NewFlagSet("push", flag.ExitOnError)
	dir := flags.String("layout", "", "an OCI layout written by `oci layout`")
	ref := flags.String("ref", "", "where to push it: REGISTRY/REPOSITORY:TAG")
	insecure := flags.Bool("insecure", false, "plain HTTP (a local registry)")
	_ = flags.Parse(args)
	var options []name.Option
	if *insecure {
		options = append(options, name.Insecure)
	}
	tag, err := name.NewTag(*ref, options...)
	if err != nil {
		return fmt.Errorf("push: %w", err)
	}
	if strings.HasSuffix(*dir, ".tar") {
		extracted, err := untar(*dir)
		if extracted != "" {
			defer os.RemoveAll(extracted)
		}
		if err != nil {
			return fmt.Errorf("push: %w", err)
		}
		*dir = extracted
	}
	index, err := theIndex(*dir)
	if err != nil {
		return fmt.Errorf("push: %w", err)
	}
	if err := remote.WriteIndex(tag, index); err != nil {
		return fmt.Errorf("push: %w", err)
	}
	digest, err := index.Digest()
	if err != nil {
		return err
	}
	fmt.Println(digest.String())
	return nil
}

func digestCommand(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("digest: usage: oci digest REF")
	}
	ref, err := name.ParseReference(args[0])
	if err != nil {
		return fmt.Errorf("digest: %w", err)
	}
	descriptor, err := remote.Head(ref)
	if err != nil {
		return fmt.Errorf("digest: %w", err)
	}
	fmt.Println(descriptor.Digest.String())
	return nil
}

func registryCommand(args []string) error {
	flags := flag.NewFlagSet("registry", flag.ExitOnError)
	addr := flags.String("addr", ":5000", "where to listen")
	dir := flags.String("dir", "", "keep blobs on disk here (default: in memory)")
	_ = flags.Parse(args)
	options := []registry.Option{registry.WithReferrersSupport(true)}
	if *dir != "" {
		options = append(options, registry.WithBlobHandler(registry.NewDiskBlobHandler(*dir)))
	}
	log.Printf("serving the OCI distribution API on %s", *addr)
	server := &http.Server{Addr: *addr, Handler: registry.New(options...), ReadHeaderTimeout: 10 * time.Second}
	return server.ListenAndServe()
}
