# Installation: the libraries, their public headers under include/loom/<folder>/, and a CMake
# package (LoomConfig.cmake, LoomConfigVersion.cmake, LoomTargets.cmake) so that other projects
# write find_package(Loom) and link loom::loom. Included at the end of the top-level CMakeLists.txt.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_loom_libs loom_kernels loom_engine loom_autograd loom_optim loom_models loom_dist loom_text)
set(_loom_header_dirs kernels engine autograd optim models dist text)
# loom_dist links MPI (LoomConfig.cmake finds it) and, with CUDA, NCCL by its full path.
set(_loom_has_train OFF)  # train/ may be absent from a partial checkout
if(TARGET loom_train)
  list(APPEND _loom_libs loom_train)
  list(APPEND _loom_header_dirs train)
  set(_loom_has_train ON)
endif()

# loom::loom: one target that brings every library (and through them their include directory,
# compile definitions and link dependencies).
add_library(loom_all INTERFACE)
set_target_properties(loom_all PROPERTIES EXPORT_NAME loom)
target_link_libraries(loom_all INTERFACE ${_loom_libs})
# <loom/loom.h>, the one public header, lives in include/loom/ (in the tree and installed).
target_include_directories(loom_all INTERFACE $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                                              $<INSTALL_INTERFACE:include>)
install(FILES ${PROJECT_SOURCE_DIR}/include/loom/loom.h DESTINATION include/loom)
add_library(loom::loom ALIAS loom_all)
foreach(_lib ${_loom_libs})
  string(REPLACE "loom_" "" _short ${_lib})
  add_library(loom::${_short} ALIAS ${_lib})  # loom::models etc., as exported
  set_target_properties(${_lib} PROPERTIES EXPORT_NAME ${_short})
endforeach()

install(TARGETS ${_loom_libs} loom_all EXPORT LoomTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# Headers keep their folder so that "models/lora.h" resolves against include/loom (the
# $<INSTALL_INTERFACE:include/loom> of every library). Only the top level of each folder is public
# (kernels/cpu and kernels/cuda hold implementation details), and no *_internal.h.
foreach(_dir ${_loom_header_dirs})
  file(GLOB _headers CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${_dir}/*.h)
  list(FILTER _headers EXCLUDE REGEX "_internal\\.h$")
  install(FILES ${_headers} DESTINATION include/loom/${_dir})
endforeach()

set(_loom_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/Loom)
install(EXPORT LoomTargets NAMESPACE loom:: DESTINATION ${_loom_cmake_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/LoomConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/LoomConfig.cmake INSTALL_DESTINATION ${_loom_cmake_dir})
# 0.x releases make no compatibility promise across minor versions.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/LoomConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/LoomConfig.cmake ${PROJECT_BINARY_DIR}/LoomConfigVersion.cmake
        DESTINATION ${_loom_cmake_dir})
