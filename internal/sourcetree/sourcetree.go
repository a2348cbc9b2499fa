// Package sourcetree finds Corral's source tree: the directory whose
// go.mod declares the module github.com/corralhq/corral. `corrald images
// build` builds corral-node from it and corral-lab builds corrald and
// corral from it. It imports only the standard library.
package sourcetree

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Module is the path Corral's go.mod declares.
const Module = "github.com/corralhq/corral"

// ErrNotFound means no directory from the start up to the root holds Corral's
// go.mod.
var ErrNotFound = errors.New("not inside the Corral source tree")

// Find walks up from dir to the directory holding Corral's go.mod and
// returns it. It reads only the first line of each go.mod on the way.
func Find(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		if isRoot(filepath.Join(dir, "go.mod")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("%w (from %s)", ErrNotFound, dir)
		}
		dir = parent
	}
}

// FindFromWorkingDir is Find from the working directory.
func FindFromWorkingDir() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	return Find(wd)
}

// isRoot reports whether the go.mod at path declares Module on its first
// line.
func isRoot(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return false
	}
	return strings.TrimSpace(strings.TrimPrefix(sc.Text(), "module")) == Module
}
