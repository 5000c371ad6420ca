# The Python module (python/, docs/python.md) against the program: tests/python/test_module.py.
# Skipped (exit 77) when the module was not built (no pybind11-dev or python3-dev) or NumPy is
# absent, with a note saying which.
if(MESHTRAIN_PYTHON_MODULE)
  add_test(NAME python_module
           COMMAND ${CMAKE_COMMAND} -E env PYTHONPATH=${CMAKE_BINARY_DIR}/python
                   ${MESHTRAIN_PYTHON_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/python/test_module.py
                   ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR})
  set_tests_properties(python_module PROPERTIES TIMEOUT 600 LABELS python SKIP_RETURN_CODE 77
                       PASS_REGULAR_EXPRESSION "PYTHON MODULE OK")
else()
  add_test(NAME python_module
           COMMAND sh -c "echo 'SKIP: the Python module was not built (pybind11-dev and python3-dev are needed)'; exit 77")
  set_tests_properties(python_module PROPERTIES LABELS python SKIP_RETURN_CODE 77)
endif()

# The same module under mpirun: two Python processes, one rank each (tests/python/test_mpi.py).
if(MESHTRAIN_PYTHON_MODULE AND MESHTRAIN_HAVE_MPI)
  find_program(MESHTRAIN_MPIRUN NAMES mpirun mpiexec)
  set(_ckpt ${CMAKE_BINARY_DIR}/tests/python_mpi_checkpoint)
  add_test(NAME python_module_mpi
           COMMAND sh -c "rm -rf '${_ckpt}' && exec '${MESHTRAIN_MPIRUN}' --allow-run-as-root --oversubscribe --mca btl vader,self --bind-to none -np 2 -x PYTHONPATH='${CMAKE_BINARY_DIR}/python' '${MESHTRAIN_PYTHON_EXECUTABLE}' '${CMAKE_SOURCE_DIR}/tests/python/test_mpi.py' '${CMAKE_BINARY_DIR}' '${_ckpt}'")
  set_tests_properties(python_module_mpi PROPERTIES TIMEOUT 300 LABELS python SKIP_RETURN_CODE 77
                       PASS_REGULAR_EXPRESSION "PYTHON MPI OK")
endif()
