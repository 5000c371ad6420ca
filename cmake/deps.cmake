# Finds a dependency the build cannot do without. When it is missing, CMake stops with one
# sentence that names the Debian package(s) and scripts/setup.sh (which installs them all),
# instead of the package's own multi-line report.
#   meshtrain_require(<find_package name> "<debian packages>" [find_package arguments...])
macro(meshtrain_require name debs)
  find_package(${name} ${ARGN} QUIET)
  if(NOT ${name}_FOUND)
    set(_why "")
    if(DEFINED ${name}_NOT_FOUND_MESSAGE AND NOT "${${name}_NOT_FOUND_MESSAGE}" STREQUAL "")
      set(_why " (${${name}_NOT_FOUND_MESSAGE})")
    endif()
    message(FATAL_ERROR "meshtrain needs ${name}, which was not found${_why}: run "
                        "scripts/setup.sh, which installs the Debian package(s) ${debs}.")
  endif()
endmacro()
