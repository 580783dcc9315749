// Command probe runs inside a test VM: it prints the kernel release, the
// loaded modules it is asked about and what a host program prints, then
// exits with the code it is given.
//
//	probe CODE MODULE PROGRAM [ARGS...]
package main

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
)

func main() {
	var u syscall.Utsname
	if err := syscall.Uname(&u); err != nil {
		fmt.Println("probe: uname:", err)
		os.Exit(100)
	}
	var rel []byte
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		rel = append(rel, byte(c))
	}
	fmt.Printf("probe: release %s\n", rel)
	mods, _ := os.ReadFile("/proc/modules")
	fmt.Printf("probe: module %s loaded: %v\n", os.Args[2], strings.Contains(string(mods), os.Args[2]+" "))
	out, err := exec.Command(os.Args[3], os.Args[4:]...).CombinedOutput()
	fmt.Printf("probe: %s says %q (error %v)\n", os.Args[3], strings.TrimSpace(string(out)), err)
	code, _ := strconv.Atoi(os.Args[1])
	os.Exit(code)
}
